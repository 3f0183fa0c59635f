"""INT8 inference over a real local[2] Spark: the fine-tuned digits model quantised once on the
driver from a DataFrame sample, shipped to the workers and loaded once per Python worker, with
accuracy within 1 point of fp32 on held-out digits."""

from __future__ import annotations

import numpy as np
import pytest

from optim import TFPredictor
from optim.predict import quantize
from tests.tfnet import transfer

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


def test_int8_over_spark_keeps_accuracy_quantised_once_loaded_once_per_worker(spark):
    net = transfer.fine_tune().net
    (xtr, _), (xte, yte) = transfer.data()
    train_df = spark.createDataFrame([(xtr[i].ravel().tolist(),) for i in range(len(xtr))],
                                     "pixels array<float>").repartition(2)
    test_df = spark.createDataFrame([(i, int(yte[i]), xte[i].ravel().tolist()) for i in range(len(xte))],
                                    "id long, label long, pixels array<float>").repartition(2)
    before = quantize.quantization_count()
    with TFPredictor(net, batch_per_thread=32, backend="openvino", precision="int8", calibration=train_df,
                     calibration_cols="pixels", calibration_size=300) as p:
        assert p.precision == "int8" and quantize.quantization_count() == before + 1
        rows = sorted(p.predict(test_df, feature_cols="pixels").collect(), key=lambda r: r.id)
        again = p.predict(test_df.coalesce(1), feature_cols="pixels").select("output").collect()
        stats = p.stats()
    got = np.array([r.output for r in rows], np.float32)
    labels = np.array([r.label for r in rows])
    fp32 = transfer.accuracy(net.forward(xte), yte)
    assert fp32 >= 0.95
    assert abs(transfer.accuracy(got, labels) - fp32) <= 0.01
    # the workers ran the same quantised model as here: another quantisation is 1e-2 off; the partitions batch the
    # rows otherwise than here, and the engine may sum in another order for another batch shape
    np.testing.assert_allclose(got, p.predict(xte), rtol=1e-5, atol=1e-6)
    assert len(again) == len(xte)
    assert stats["quantizations"] == 1 and quantize.quantization_count() == before + 1
    assert stats["rows"] == 2 * len(xte)
    assert stats["loads"] and set(stats["loads"].values()) == {1}, stats["loads"]  # once per Python worker


def test_bad_calibration_dataframes(spark):
    from optim.errors import CalibrationError

    net = transfer.new_net()
    short = spark.createDataFrame([([0.5] * 10,) for _ in range(6)], "pixels array<float>")
    with pytest.raises(CalibrationError, match=r"No sampled row of calibration column 'pixels' fits input .*row 0"):
        TFPredictor(net, backend="openvino", precision="int8", calibration=short, calibration_cols="pixels")
    empty = short.limit(0)
    with pytest.raises(CalibrationError, match=r"calibration DataFrame is empty \(0 rows\)"):
        TFPredictor(net, backend="openvino", precision="int8", calibration=empty, calibration_cols="pixels")
