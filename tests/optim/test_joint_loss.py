"""A loss over several outputs at once (``optim.losses.joint``): a contrastive loss over the two
embeddings of a siamese net, which no per-output loss can express, trained by TFOptimizer and
``from_loss`` equal to a ``tf.GradientTape`` loop on the Keras model, and on two Spark ranks equal
to the local run. One plain callable on a net of several outputs stays per output, as in Keras."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import optim
from optim import TFOptimizer
from tests import digits
from tfnet import TFNet

LR = 0.1


def contrastive(y_true, y_pred, margin=1.0):
    """Hadsell et al.'s contrastive loss: pairs of one class pulled together, other pairs pushed
    ``margin`` apart. It needs both labels (same class or not) and both embeddings at once."""
    same = tf.cast(tf.equal(tf.reshape(y_true[0], [-1]), tf.reshape(y_true[1], [-1])), tf.float32)
    d2 = tf.reduce_sum(tf.square(y_pred[0] - y_pred[1]), axis=-1)
    far = tf.nn.relu(margin - tf.sqrt(d2 + 1e-9))
    return tf.reduce_mean(same * d2 + (1.0 - same) * tf.square(far))


def siamese(seed=0):
    """One tower (its layers shared) applied to a left and a right image: two embedding outputs."""
    keras.utils.set_random_seed(seed)
    flat, hidden = keras.layers.Flatten(name="flat"), keras.layers.Dense(16, activation="tanh", name="hidden")
    embed = keras.layers.Dense(4, name="embed")
    left, right = keras.Input((8, 8, 1), name="left"), keras.Input((8, 8, 1), name="right")
    return keras.Model([left, right], [embed(hidden(flat(left))), embed(hidden(flat(right)))])


def pairs(n=256, seed=0):
    """``([left, right], [left labels, right labels])``: every other pair of one class."""
    x, y = digits.load()
    rng = np.random.default_rng(seed)
    by_class = {c: np.flatnonzero(y == c) for c in range(10)}
    left = rng.choice(len(x), n, replace=False)
    right = np.array([rng.choice(by_class[y[i]]) if k % 2 == 0 else rng.choice(np.flatnonzero(y != y[i]))
                      for k, i in enumerate(left)])
    return [x[left], x[right]], [y[left], y[right]]


def tape_oracle(model, features, labels, epochs=2, batch=32):
    """SGD on the Keras model with tf.GradientTape, batches in order: the oracle."""
    variables = model.trainable_variables
    for _ in range(epochs):
        for start in range(0, len(labels[0]), batch):
            rows = slice(start, start + batch)
            with tf.GradientTape() as tape:
                loss = contrastive([t[rows] for t in labels], model([f[rows] for f in features]))
            for v, g in zip(variables, tape.gradient(loss, variables)):
                v.assign_sub(LR * g)
    return {v.path: v.numpy() for v in variables}


def _max_diff(a: dict, b: dict) -> float:
    assert sorted(a) == sorted(b)
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


def test_a_joint_contrastive_loss_equals_gradient_tape():
    features, labels = pairs()
    model = siamese()
    net = TFNet.from_keras(model)
    assert len(net.output_names) == 2 and len(net.trainable) == 4  # the tower's weights, once
    loss = optim.losses.joint(contrastive)
    start = {k: v.copy() for k, v in net.get_weights().items()}
    opt = TFOptimizer(net, loss, optim.SGD(LR))
    assert opt.loss is loss
    # the loss at the start: the function of both outputs, as Keras's model computes them
    first = float(contrastive(labels, model(features)))
    assert opt.evaluate((features, labels), batch_size=256)["loss"] == pytest.approx(first, rel=1e-5)
    opt.optimize((features, labels), epochs=2, batch_size=32, shuffle=False, verbose=0)
    want = tape_oracle(model, features, labels)
    assert _max_diff(net.get_weights(), want) < 1e-5
    assert _max_diff(net.get_weights(), start) > 1e-2, "the weights moved"
    # from_loss, Analytics Zoo's name for the constructor, takes it alike
    again = TFNet.from_keras(siamese())
    TFOptimizer.from_loss(again, optim.losses.joint(contrastive), optim.SGD(LR)).optimize(
        (features, labels), epochs=2, batch_size=32, shuffle=False, verbose=0)
    assert _max_diff(again.get_weights(), net.get_weights()) == 0.0


def test_one_plain_callable_stays_per_output():
    """Without joint, one callable on a net of two outputs is applied to each output and summed,
    as Keras compiles it."""
    features, labels = pairs(64)
    net = TFNet.from_keras(siamese())

    def norm_to_label(t, p):
        return tf.reduce_mean(tf.square(tf.norm(p, axis=-1) - tf.cast(t, tf.float32) / 10.0))

    opt = TFOptimizer(net, norm_to_label, optim.SGD(LR))
    assert isinstance(opt.loss, optim.losses.MultiOutputLoss)
    outs = net.forward(features)
    want = sum(float(norm_to_label(t, o)) for t, o in zip(labels, outs))
    assert opt.evaluate((features, labels), batch_size=64)["loss"] == pytest.approx(want, rel=1e-5)


def test_joint_loss_errors():
    features, labels = pairs(64)
    net = TFNet.from_keras(siamese())
    with pytest.raises(TypeError, match=r"optim.losses.joint takes a callable fn\(y_true_list, y_pred_list\) -> "
                                        r"scalar. Received: 'contrastive'"):
        optim.losses.joint("contrastive")
    with pytest.raises(ValueError, match=r"`loss_weights` weigh per-output losses; a joint loss \(optim.losses.joint\) "
                                         r"weighs its outputs itself. Received: loss_weights=\[1.0, 2.0\]"):
        TFOptimizer(net, optim.losses.joint(contrastive), optim.SGD(LR), loss_weights=[1.0, 2.0])
    with pytest.raises(TypeError, match=r"A joint loss \(optim.losses.joint\) takes every output at once; give it "
                                        r"alone"):
        TFOptimizer(net, [optim.losses.joint(contrastive), "mse"], optim.SGD(LR))
    opt = TFOptimizer(net, optim.losses.joint(contrastive), optim.SGD(LR))
    before = net.get_weights()
    with pytest.raises(optim.LabelShapeError, match=r"The joint loss 'contrastive' takes one label array per output, "
                                                    r"a list in output order: the net has 2 output\(s\). Received: 3"):
        opt.optimize((features, labels + [labels[0]]), batch_size=32, verbose=0)
    with pytest.raises(TypeError, match=r"The joint loss 'contrastive' is a function of whole batches of every output "
                                        r"and cannot weight examples"):
        opt.optimize((features, labels), sample_weight=np.ones(64, np.float32), batch_size=32, verbose=0)
    assert all(np.array_equal(before[k], v) for k, v in net.get_weights().items()), "nothing trained"


@pytest.mark.spark
@pytest.mark.parallel
def test_a_joint_loss_on_two_spark_ranks_equals_the_local_run(spark):
    """Numpy pairs sharded row by row (rank r takes pairs r, r + 2, ...): each step's global batch
    is the local run's, and the loss is a mean over pairs, so the ranks' average is the local loss."""
    features, labels = pairs()
    local, ranks = TFNet.from_keras(siamese()), TFNet.from_keras(siamese())
    h_local = TFOptimizer(local, optim.losses.joint(contrastive), optim.SGD(LR)).optimize(
        (features, labels), epochs=2, batch_size=32, shuffle=False, verbose=0)
    opt = TFOptimizer(ranks, optim.losses.joint(contrastive), optim.SGD(LR))
    h_ranks = opt.optimize((features, labels), epochs=2, batch_size=32, shuffle=False, num_workers=2, verbose=0)
    assert opt.global_step == 16
    assert _max_diff(local.get_weights(), ranks.get_weights()) < 1e-5
    np.testing.assert_allclose(h_ranks["loss"], h_local["loss"], rtol=1e-5)
    assert h_ranks["loss"][-1] < h_ranks["loss"][0]
