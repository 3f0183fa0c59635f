"""Keras's transfer-learning flow on two ranks (issue 51): a frozen base and a new head trained by tfnet over a real
local[2] Spark with Horovod over Gloo equal Keras's own ``fit`` on the same global batches, in both phases, and only
the head's bytes are allreduced while the base is frozen; weight regularizers as fit adds them. A compiled subclassed
model, too, with a per-example loss function, a Keras metric merged over the ranks and the weights' moving average
(use_ema)."""

import numpy as np
import pytest

import optim
from optim import TFOptimizer
from tests.keras_subclassed import subclassed_cnn
from tests.optim.keras_transfer import LR_FINE, LR_HEAD, data, keras_fit, max_diff, transfer_model, unfreeze_all_but_batch_norm
from tfnet import TFNet

pytestmark = [pytest.mark.spark, pytest.mark.parallel]

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


def as_two_ranks_see_it(x, y, batch: int):
    """The rows in the order Keras's fit must see them to take the steps two ranks take: rank r holds rows r, r + 2,
    ...; step k averages each rank's k-th block of ``batch / 2`` rows, which is one step over both blocks."""
    per = batch // 2
    shards = [(x[r::2], y[r::2]) for r in range(2)]
    steps = len(shards[0][0]) // per
    order = [np.concatenate([s[i][k * per:(k + 1) * per] for s in shards]) for i in range(2) for k in range(steps)]
    xs, ys = order[:steps], order[steps:]
    return np.concatenate(xs), np.concatenate(ys)


def test_the_transfer_learning_flow_on_two_ranks_trains_as_keras_fit(spark):
    """With weight regularizers on the base and the head, which Keras's fit adds to the loss for the trainable
    weights: each rank adds them to its loss, and the averaged gradient is fit's on the global batch."""
    x, y = data(64)
    kx, ky = as_two_ranks_see_it(x, y, 16)
    reference, _ = transfer_model(regularized=True)
    model, _ = transfer_model(regularized=True)
    net = TFNet.from_keras(model)
    want = keras_fit(reference, kx, ky, LR_HEAD, 16)
    history = TFOptimizer(net, SCE, optim.SGD(LR_HEAD)).optimize(
        (x, y), batch_size=16, shuffle=False, num_workers=2, verbose=0)
    assert max_diff(net, want) < 1e-6
    head_bytes = sum(w.nbytes for k, w in net.get_weights().items() if k.startswith("head/"))
    assert history["bytes_per_step"] == [head_bytes + 4]  # the head's gradients and the loss, nothing of the base
    for keras_model in (reference, model):
        unfreeze_all_but_batch_norm(keras_model.get_layer("base"))
    want = keras_fit(reference, kx, ky, LR_FINE, 16)
    net.trainable = [v.path for v in model.trainable_variables]
    history = TFOptimizer(net, SCE, optim.SGD(LR_FINE)).optimize(
        (x, y), batch_size=16, shuffle=False, num_workers=2, verbose=0)
    assert max_diff(net, want) < 1e-6
    assert history["bytes_per_step"][0] > head_bytes + 4


def test_a_compiled_subclassed_model_on_two_ranks_trains_as_keras_fit(spark):
    """``TFOptimizer.from_keras`` on a subclassed model (its own ``call``, built by its first call), over two ranks,
    against ``fit`` on the same global batches; batch norm frozen and no dropout, as ``fit``'s ``training=True``
    would otherwise compute another function."""
    import keras

    x, y = data(64)
    kx, ky = as_two_ranks_see_it(x, y, 16)
    reference, _ = subclassed_cnn(frozen_bn=True, dropout=0.0)
    model, _ = subclassed_cnn(frozen_bn=True, dropout=0.0)
    # a loss function of per-example values (Keras wraps it, tfnet ships Keras's wrapper to the ranks), a Keras metric
    # tfnet does not compute itself, merged over the ranks, and the weights' moving average (use_ema), which every rank
    # keeps alike and training ends with, as fit's end
    def sparse_xent(y_true, y_pred):  # defined here: shipped by value, with its globals
        return keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)

    for keras_model in (reference, model):
        keras_model.compile(optimizer=keras.optimizers.SGD(LR_HEAD, use_ema=True, ema_momentum=0.5), loss=sparse_xent,
                            metrics=[keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="xent")])
    opt = TFOptimizer.from_keras(model)
    theirs = reference.fit(kx, ky, batch_size=16, epochs=1, shuffle=False, verbose=0).history
    want = {v.path: v.numpy() for v in reference.weights}
    ours = opt.optimize((x, y), batch_size=16, shuffle=False, num_workers=2, verbose=0)
    assert max_diff(opt.net, want) < 1e-6
    np.testing.assert_allclose(ours["xent"], theirs["xent"], rtol=1e-6)
    assert float(np.abs(want["cnn/conv/kernel"] - model.get_layer("conv").kernel.numpy()).max()) > 1e-4  # it trained
