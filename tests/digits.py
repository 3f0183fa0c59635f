"""scikit-learn's digits and the small CNN the tests use: the same helpers as the main job's
(:mod:`examples.digits`)."""

from examples.digits import cnn, load, split

__all__ = ["cnn", "frame", "load", "split"]


def frame(spark, x, y, rows: int = 1024, partitions: int = 2):
    """The first ``rows`` digits as a DataFrame (``pixels array<float>, label long``) of ``partitions`` slices of
    the rows in order, with no shuffle: the same rows, in the same order, on the same partitions in any session (a
    local one and a cluster's), so two runs over it can be compared weight for weight."""
    records = [(x[i].ravel().tolist(), int(y[i])) for i in range(rows)]
    return spark.createDataFrame(spark.sparkContext.parallelize(records, partitions), "pixels array<float>, label long")
