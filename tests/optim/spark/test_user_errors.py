"""The errors a new user meets (issue 33, points 6-8), on scikit-learn's breast-cancer table over
real local[2] Spark:

* mistakes the driver can see (``feature_shapes`` that do not fit the net, a misspelt
  ``feature_shapes`` key, a string label column for a class-id loss) fail there, typed, before the
  training stage is launched;
* an error raised on a rank reaches the user typed, in 25 lines or fewer as Python prints it, with
  the rank, the partition and the row; the JVM's stack and the rank's traceback are attributes, not
  console text;
* a lazy TFPredictor result with a bad row raises BadRowError (also pyspark's own exception class)
  from the action that collects it, DataFrame or RDD.
"""

import traceback

import keras
import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer

import optim
from optim import BadRowError, ColumnError, DataError, TFDataset, TFNetEstimator, TFOptimizer, TFPredictor
from optim.spark import typed_errors
from tfnet import TFNet
from tfnet.errors import InputSpecError

pytestmark = pytest.mark.spark

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


def cancer(spark, label_type="double", null_row=None, bad_label_row=None):
    x, y = load_breast_cancer(return_X_y=True)
    x = ((x - x.mean(0)) / x.std(0)).astype("float32")[:128]
    rows = []
    for i in range(128):
        label = {"double": float(y[i]), "string": "malignant" if y[i] == 0 else "benign"}[label_type]
        rows.append((i, None if i == null_row else x[i].tolist(), 7.0 if i == bad_label_row else label))
    return spark.createDataFrame(rows, f"id long, x array<float>, label {label_type}").repartition(2), x


def net():
    keras.utils.set_random_seed(0)
    return TFNet.from_keras(keras.Sequential([keras.Input((30,), name="x"), keras.layers.Dense(2, name="logits")]))


def printed(err: BaseException) -> list[str]:
    """What Python prints for ``err`` uncaught: the traceback from the caller, notes and causes."""
    return "".join(traceback.format_exception(err)).rstrip("\n").split("\n")


@pytest.fixture
def no_stage(monkeypatch):
    """The training stage is never launched."""
    def launched(*args, **kwargs):
        raise AssertionError("the training stage was launched")

    monkeypatch.setattr("optim.launch.launcher.optimize_distributed", launched)


def test_mistakes_the_driver_can_see_fail_there(spark, no_stage):
    df, _ = cancer(spark)
    opt = TFOptimizer(net(), SCE, optim.SGD(0.1))
    with pytest.raises(InputSpecError, match=r"Column 'x' has rows of shape \(5, 6\), and input 'x:0' "
                                             r"takes rows of shape \(30,\) \(the net's input is \(None, 30\), the batch "
                                             r"first\)."):
        opt.optimize(TFDataset.from_dataframe(df, "x", "label", feature_shapes=[(5, 6)]), num_workers=2, verbose=0)
    with pytest.raises(ColumnError, match=r"feature_shapes names column 'xx', which is not among feature_cols or "
                                          r"label_cols \['x', 'label'\]; closest: \['x'\]. Its shape would be ignored"):
        TFDataset.from_dataframe(df, "x", "label", feature_shapes={"xx": (30,)})
    strings, _ = cancer(spark, label_type="string")
    with pytest.raises(DataError, match=r"the training data: label column 'label' holds string values, and "
                                        r"SparseCategoricalCrossentropy \(output logits:0\) needs class ids "
                                        r"0..classes-1: index them first, e.g. pyspark.ml.feature.StringIndexer\("
                                        r"inputCol='label', outputCol='label_index'\) for a DataFrame"):
        opt.optimize(TFDataset.from_dataframe(strings, "x", "label"), num_workers=2, verbose=0)
    with pytest.raises(DataError, match=r"label column 'label' holds string values, and MeanSquaredError \(output "
                                        r"logits:0\) needs numbers: cast the column to a number"):
        TFOptimizer(net(), "mse", optim.SGD(0.1)).optimize(TFDataset.from_dataframe(strings, "x", "label"),
                                                           num_workers=2, verbose=0)
    assert opt.global_step == 0


@pytest.mark.parallel
def test_an_error_on_a_rank_is_short_typed_and_says_where(spark):
    # as after any TFPredictor.predict in this process (CI's order): pyspark's own actions raise typed errors, so the
    # stage's failure reaches the launcher already typed; spark_error is still the Spark exception itself
    typed_errors.install()
    nulls, _ = cancer(spark, null_row=5)
    with pytest.raises(BadRowError) as caught:
        TFOptimizer(net(), SCE, optim.SGD(0.1)).optimize(TFDataset.from_dataframe(nulls, "x", "label"), batch_size=16,
                                                         num_workers=2, verbose=0)
    err = caught.value
    assert err.__class__ is BadRowError
    lines = printed(err)
    assert len(lines) <= 25, "\n".join(lines)
    assert lines[-2].startswith("optim.errors.BadRowError: Column 'x' is null at row ") and \
        lines[-2].endswith(f"every training row needs a value. (rank {err.rank})"), lines
    assert lines[-1].startswith(f"Raised on rank {err.rank} at optim/arrow.py:"), lines
    assert not any("at org.apache.spark" in line or "Py4JJavaError" in line for line in lines)
    assert "read_column" in err.worker_traceback and "org.apache.spark" in str(err.spark_error)
    # through TFNetEstimator (pyspark's fit in between), a label out of range
    labels, _ = cancer(spark, bad_label_row=9)
    with pytest.raises(DataError, match=r"the labels of partition \d for output logits:0: row \d+ holds class 7, "
                                        r"outside 0..1 \(the output has 2 classes\); 1 row\(s\) are out of range. "
                                        r"\(rank \d\)") as caught:
        TFNetEstimator(net(), featureCols=["x"], numWorkers=2, batchSize=16).fit(labels)
    lines = printed(caught.value)
    assert len(lines) <= 25 and not any("at org.apache.spark" in line for line in lines), "\n".join(lines)


def test_a_lazy_prediction_raises_the_typed_error_as_it_is_collected(spark, tmp_path):
    from pyspark.errors import PythonException

    nulls, x = cancer(spark, null_row=5)
    scored = TFPredictor(net()).predict(nulls.select("id", "x"), feature_cols="x")  # lazy: nothing runs yet
    for action in (lambda: scored.collect(), lambda: scored.toPandas(), lambda: scored.write.parquet(str(tmp_path / "p"))):
        with pytest.raises(BadRowError, match=r"^Column 'x', row \d+ of partition \d: the value is null. Fix or filter "
                                              r"the row, or pass on_error='null'") as caught:
            action()
        assert isinstance(caught.value, PythonException)  # a handler written for Spark's error still catches it
        lines = printed(caught.value)
        assert len(lines) <= 25 and not any("at org.apache.spark" in line for line in lines), "\n".join(lines)
    # an RDD of elements, one of them of the wrong length
    rdd = spark.sparkContext.parallelize([x[i] for i in range(6)] + [x[0][:10]], 2)
    with pytest.raises(BadRowError, match=r"Row 3 of partition 1: input 'x:0' needs per-row shape \(30,\); received "
                                          r"shape \(10,\)"):
        TFPredictor(net()).predict(rdd).collect()
    # good rows still predict, and pyspark's own errors pass unchanged
    np.testing.assert_allclose(np.array([r.output for r in TFPredictor(net()).predict(
        cancer(spark)[0].select("id", "x"), feature_cols="x").orderBy("id").collect()]), net().forward(x),
        rtol=1e-5, atol=1e-6)
    from pyspark.errors import AnalysisException

    with pytest.raises(AnalysisException):
        scored.select("no_such_column").collect()
