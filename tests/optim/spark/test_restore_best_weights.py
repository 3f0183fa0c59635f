"""Keras's ``EarlyStopping(restore_best_weights=True)`` over two ranks of a real Spark local[2]: the callback runs on
rank 0, in a Spark worker; the driver's net ends with the weights of the best epoch, compared by value with that
epoch's checkpoint (written at the epoch's end, before the callback saw its logs), not the last epoch's."""

import keras
import numpy as np
import pytest

import optim
from optim import TFOptimizer
from optim.training.checkpoint import CheckpointManager
from tests import digits
from tfnet import TFNet

pytestmark = [pytest.mark.spark, pytest.mark.parallel]


def test_restore_best_weights_on_two_ranks_leaves_the_best_epochs_weights_on_the_drivers_net(spark, tmp_path):
    x, y = digits.load()
    x, y = x[:128], y[:128]
    # the "best" epoch is the one of the highest loss (mode="max"): epoch 0, as the loss falls; epoch 1 is no better,
    # so it stops there (patience 1) and restores epoch 0's weights, which are not the last ones
    stop = keras.callbacks.EarlyStopping(monitor="loss", mode="max", patience=1, restore_best_weights=True)
    opt = TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)),
                      optim.losses.SparseCategoricalCrossentropy(from_logits=True), optim.SGD(0.05, momentum=0.9),
                      model_dir=str(tmp_path))
    history = opt.optimize((x, y), epochs=4, batch_size=32, num_workers=2, verbose=0, keep_checkpoints=10,
                           callbacks=[stop])
    assert len(history["loss"]) == 2 and history["loss"][1] < history["loss"][0], history
    manager = CheckpointManager(str(tmp_path / "checkpoints"), run_id=opt.last_run["run_id"])
    assert manager.all_steps() == [4, 8]  # each epoch's end (4 steps of 16 rows per rank)
    best, last = (CheckpointManager.load(manager.path_for(s)).weights for s in (4, 8))
    ours = opt.net.get_weights()
    assert list(ours) == list(best)
    for name, value in ours.items():
        np.testing.assert_array_equal(value, best[name], err_msg=name)
    assert any(not np.array_equal(value, last[name]) for name, value in ours.items()), "not the last epoch's"
