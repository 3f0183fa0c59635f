"""The workers start importing TensorFlow as soon as tfnet creates or finds the session."""

import pytest

from optim.spark.driver import preflight

pytestmark = pytest.mark.spark


def test_the_session_starts_one_warm_up_per_application(spark):
    sc = spark.sparkContext
    warm = preflight._STARTED.get(sc.applicationId)
    assert warm is not None, "build_session started the workers' imports"
    reports = warm.wait(300)
    assert reports and all("tfnet" not in r and "tensorflow" not in r for r in reports), reports
    # finding the session again (a DataFrame wrapped for training) starts no second job
    from optim import TFDataset

    started = dict(preflight._STARTED)
    data = TFDataset.from_dataframe(spark.createDataFrame([([1.0], 0)], "x array<float>, y long"), "x", "y")
    assert data.has_labels and preflight._STARTED == started
    assert preflight.ensure_warm_up(spark) is warm
