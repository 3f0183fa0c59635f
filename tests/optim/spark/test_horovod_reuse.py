"""A Spark Python worker that ran Horovod before (here: a one-rank run) joins the next two-rank run
beside a worker that did not. With the response cache on, that run's first attempt failed on both
ranks (Gloo: `op.preamble.length <= op.nbytes`), a worker died and the stage was retried, every
time, for ResNet-50 (not for a small CNN or MobileNetV2). The cause was the `HOROVOD_CYCLE_TIME=20`
tfnet then gave nets of 5M+ values: Horovod carries a fixed cycle time over to the next `hvd.init()`
of the process and the reused worker ends up with a 1 MiB fusion threshold (docs/distributed.md,
"Horovod's response cache"; tests/optim/training/test_horovod_reuse_process.py reproduces it without
Spark). tfnet no longer sets it, and `HorovodSession` keeps it from Horovod."""

import numpy as np
import pytest

import optim
from optim import TFDataset, TFOptimizer
from tfnet import TFNet

pytestmark = [pytest.mark.spark, pytest.mark.parallel, pytest.mark.slow]


def test_two_ranks_after_one_rank_need_one_attempt(spark):
    import keras
    import tensorflow as tf

    model = keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3))
    batch, steps = 8, 4

    def synthetic(rank, n_ranks):
        rng = np.random.default_rng(rank)
        x = rng.uniform(-1, 1, (batch, 32, 32, 3)).astype("float32")
        y = rng.integers(0, 1000, batch).astype("int64")
        return tf.data.Dataset.from_tensors((x, y)).repeat(steps)

    for workers in (1, 2):
        opt = TFOptimizer(TFNet.from_keras(model), "sparse_categorical_crossentropy", optim.SGD(1e-3, momentum=0.9))
        opt.optimize(TFDataset.from_tf_data(synthetic), epochs=1, num_workers=workers, verbose=0, timeout=300,
                     startup_timeout=300)
        run = opt.last_run
        assert run["num_workers"] == workers
        assert run["attempts"] == 1, f"{workers} rank(s) needed {run['attempts']} attempts: {run['failures']}"
        assert opt.global_step == steps
