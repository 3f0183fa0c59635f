"""The losses a Keras model adds in its ``call`` (``activity_regularizer``, ``self.add_loss(...)``), which Keras's
``fit`` and ``evaluate`` add to the compiled loss (``Trainer.compute_loss``: ``model.losses``). ``from_keras`` keeps
them as tensors computed beside the outputs (``net.loss_names``), which tfnet's training step and evaluation add, as
Keras does. The oracle is Keras itself: ``fit``'s weights and history, and ``model.losses`` after a call; for a TF1
graph, a TF1 ``Session`` stepping its own regularization loss. Before, ``from_keras`` refused every such model
(``KerasMappingError``: the Keras blog's sparse autoencoder, the subclassing guide's ``add_loss`` layer, a VAE's KL
term)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import optim
from optim import TFOptimizer
from tests.optim.keras_transfer import LR_FINE, LR_HEAD, data, max_diff, transfer_model, unfreeze_all_but_batch_norm
from tfnet import TFNet
from tfnet.errors import InputSpecError, TensorNameError
from tfnet.serialize import net_from_bytes, net_to_bytes

RNG = np.random.default_rng(0)
X = RNG.normal(size=(40, 8)).astype(np.float32)


def added_by_keras(model, x) -> float:
    """What Keras's ``compute_loss`` adds for the losses the call adds: ``model.losses`` after a call, less the
    weights' regularizers (which come last)."""
    model(x)
    regularized = sum(1 for v in model.trainable_weights if v.regularizer is not None)
    losses = model.losses
    return float(sum(float(keras.ops.sum(t)) for t in losses[:len(losses) - regularized]))


def assert_fits_as_keras(make, x, y, batch_size=16, atol=1e-6):
    """Two epochs of ``fit`` and of ``TFOptimizer.from_keras`` on the same compiled model and batches, validated:
    every weight within ``atol``, the history's ``loss`` and ``val_loss`` within 1e-5."""
    reference = make()
    val = dict(validation_data=(x[:12], y[:12]))
    theirs = reference.fit(x, y, batch_size=batch_size, epochs=2, shuffle=False, verbose=0, **val).history
    model = make()
    opt = TFOptimizer.from_keras(model)
    ours = opt.optimize((x, y), batch_size=batch_size, epochs=2, shuffle=False, verbose=0, **val)
    got = opt.net.get_weights()
    for mine, v in zip(model.weights, reference.weights):  # a subclassed model's paths are numbered apart
        np.testing.assert_allclose(got[mine.path], v.numpy(), atol=atol, err_msg=v.path)
    for key in ("loss", "val_loss"):
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-5, err_msg=key)
    return opt


def sparse_autoencoder():
    """The Keras blog's sparse autoencoder ("Building Autoencoders in Keras": an L1 activity regularizer on the code),
    smaller, with a stronger penalty, an ``ActivityRegularization`` layer and a weight regularizer beside it."""
    keras.utils.set_random_seed(1)
    inputs = keras.Input((8,), name="x")
    code = keras.layers.Dense(6, activation="relu", activity_regularizer=keras.regularizers.L1(0.05), name="enc")(inputs)
    code = keras.layers.ActivityRegularization(l2=0.02, name="act")(code)
    outputs = keras.layers.Dense(8, kernel_regularizer="l2", name="dec")(code)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")
    return model


def test_the_blogs_sparse_autoencoder_trains_as_fit_with_its_activity_terms():
    model = sparse_autoencoder()
    net = TFNet.from_keras(model)
    assert net.loss_names == ["added_loss_0:0", "added_loss_1:0"]  # Dense's term and the layer's; the L2 apart
    outputs, added = net.forward(X[:16], return_losses=True)
    np.testing.assert_allclose(added, added_by_keras(model, X[:16]), rtol=1e-6)
    np.testing.assert_allclose(outputs, model(X[:16]).numpy(), rtol=1e-6, atol=1e-6)
    assert added > 0.05  # large enough to matter: without it the weights differ (below)
    opt = assert_fits_as_keras(sparse_autoencoder, X, X)
    # the terms are what the comparison checks: without them tfnet is that far from fit
    plain = TFNet.from_keras(sparse_autoencoder(), losses=[])
    assert plain.loss_names == []
    TFOptimizer(plain, optim.losses.get("mse"), optim.SGD(0.05, momentum=0.9)).optimize(
        (X, X), batch_size=16, epochs=2, shuffle=False, verbose=0)
    assert float(np.abs(plain.get_weights()["enc/kernel"] - opt.net.get_weights()["enc/kernel"]).max()) > 1e-3


class ActivityRegularizationLayer(keras.layers.Layer):
    """Keras's guide "Making new layers and models via subclassing", as it writes it."""

    def __init__(self, rate=1e-2):
        super().__init__()
        self.rate = rate

    def call(self, inputs):
        self.add_loss(self.rate * keras.ops.mean(inputs))
        return inputs


class VariationalBottleneck(keras.Model):
    """A subclassed model adding a VAE's KL term with ``add_loss``, as the guide's VAE does; decoded from the mean (the
    guide samples there, which no two runs draw alike)."""

    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(6, activation="tanh")
        self.mean = keras.layers.Dense(3)
        self.log_var = keras.layers.Dense(3)
        self.regularize = ActivityRegularizationLayer(0.1)
        self.decoder = keras.layers.Dense(8)

    def call(self, x):
        h = self.regularize(self.hidden(x))
        z_mean, z_log_var = self.mean(h), self.log_var(h)
        self.add_loss(-0.5 * keras.ops.mean(z_log_var - keras.ops.square(z_mean) - keras.ops.exp(z_log_var) + 1))
        return self.decoder(z_mean)


def bottleneck():
    keras.utils.set_random_seed(2)
    model = VariationalBottleneck()
    model(X[:1])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=keras.losses.MeanSquaredError())
    return model


def test_a_subclassed_models_add_loss_trains_as_fit():
    model = bottleneck()
    net = TFNet.from_keras(model)
    assert len(net.loss_names) == 2
    np.testing.assert_allclose(net.forward(X[:10], return_losses=True)[1], added_by_keras(model, X[:10]), rtol=1e-6)
    assert_fits_as_keras(bottleneck, X, X, batch_size=16)


def test_activity_terms_in_the_transfer_flow_count_whatever_trains():
    """A frozen base's activity term counts in the loss (Keras adds every call's), not in the gradients; the base's
    convolution, whose output its term reads, is not folded with its batch norm."""
    x, y = data(48)
    xv, yv = data(24, seed=1)
    sce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for lr, unfreeze in ((LR_HEAD, False), (LR_FINE, True)):
        reference, _ = transfer_model(regularized=True)
        model, _ = transfer_model(regularized=True)
        for m in (reference, model) if unfreeze else ():
            unfreeze_all_but_batch_norm(m.get_layer("base"))
        for m in (reference, model):
            m.compile(optimizer=keras.optimizers.SGD(lr), loss=sce)
        theirs = reference.fit(x, y, batch_size=8, epochs=2, shuffle=False, validation_data=(xv, yv), verbose=0)
        opt = TFOptimizer.from_keras(model)
        assert len(opt.net.loss_names) == 2
        ours = opt.optimize((x, y), batch_size=8, epochs=2, shuffle=False, validation_data=(xv, yv), verbose=0)
        assert max_diff(opt.net, {v.path: v.numpy() for v in reference.weights}) < 1e-6
        for key in ("loss", "val_loss"):
            np.testing.assert_allclose(ours[key], theirs.history[key], rtol=1e-5, err_msg=key)


def test_the_losses_go_wherever_the_net_goes(tmp_path):
    model, _ = transfer_model(regularized=True)
    net = TFNet.from_keras(model)
    want = float(net.forward(X_IMG, return_losses=True)[1])
    np.testing.assert_allclose(want, added_by_keras(model, X_IMG), rtol=1e-6)
    net.save(str(tmp_path / "saved"))
    for other in (TFNet.load(str(tmp_path / "saved")), net_from_bytes(net_to_bytes(net)),
                  net.with_lora("head/kernel", rank=1, seed=0), net.with_lora("head/kernel", rank=1).merged()):
        assert other.loss_names == net.loss_names
        np.testing.assert_allclose(float(other.forward(X_IMG, return_losses=True)[1]), want, rtol=1e-6)
    # cut before the head: the base's term stays, the head's goes, as a model of the base's layers has only the base's
    features = net.cut("base")
    base_term = keras.ops.sum(keras.ops.abs(model.get_layer("base").get_layer("conv")(X_IMG))) * 0.01 / len(X_IMG)
    assert len(features.loss_names) == 1 and not [w for w in features.weight_names if w.startswith("head/")]
    np.testing.assert_allclose(float(features.forward(X_IMG, return_losses=True)[1]), float(base_term), rtol=1e-5)
    # a head added keeps the base's, and brings its own
    extended = features.add_head(keras.layers.Dense(2, activity_regularizer=keras.regularizers.L1(0.5), name="d"),
                                 name="h2")
    assert extended.loss_names[0] == features.loss_names[0] and extended.loss_names[1].startswith("h2/")
    outputs, added = extended.forward(X_IMG, return_losses=True)
    np.testing.assert_allclose(added, float(base_term) + 0.5 * np.abs(outputs).sum() / len(X_IMG), rtol=1e-5)


X_IMG = data(6)[0]


def test_a_tf1_graphs_regularization_loss_trains_as_its_session():
    """A TF1 graph with its regularization loss in the graph (``tf.compat.v1.losses.get_regularization_loss``), frozen
    by TensorFlow's own converter; given as ``losses=``, tfnet's step equals the Session's GradientDescent step on the
    loss plus that term."""
    v1 = tf.compat.v1
    x_np, y_np = X[:16], X[:16, :2].sum(1, keepdims=True)
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, (None, 8), name="x")
        y = v1.placeholder(tf.float32, (None, 1), name="y")
        w_init = RNG.normal(size=(8, 1)).astype(np.float32)
        w = v1.get_variable("w", initializer=w_init)
        b = v1.get_variable("b", initializer=np.full((1,), 0.5, np.float32))
        out = tf.identity(tf.matmul(x, w) + b, name="out")
        v1.add_to_collection(v1.GraphKeys.REGULARIZATION_LOSSES, 0.3 * tf.nn.l2_loss(w))
        reg = tf.identity(v1.losses.get_regularization_loss(), name="reg")
        loss = tf.reduce_mean(tf.square(out - y)) + reg
        train = v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            frozen = v1.graph_util.convert_variables_to_constants(sess, graph.as_graph_def(), ["out", "reg"])
            sess.run(train, {x: x_np, y: y_np})
            want = dict(zip(["w", "b"], sess.run([w, b])))
    net = TFNet.from_frozen_graph(frozen, "x", "out", losses="reg")
    assert net.loss_names == ["reg:0"]
    np.testing.assert_allclose(net.forward(x_np, return_losses=True)[1], 0.15 * np.square(w_init).sum(), rtol=1e-6)
    TFOptimizer(net, optim.losses.get("mse"), optim.SGD(0.1)).optimize((x_np, y_np), batch_size=16, verbose=0)
    got = net.get_weights()
    for k in ("w", "b"):
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6, err_msg=k)


def test_what_cannot_be_a_loss_is_said():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, (None, 2), name="x")
        w = tf.constant([[1.0], [2.0]], name="w")
        tf.identity(tf.matmul(x, w), name="y")
        tf.shape(x, name="shape")
    with pytest.raises(TensorNameError, match="Unknown loss tensor 'regularisation'"):
        TFNet.from_frozen_graph(graph.as_graph_def(), "x", "y", losses="regularisation")
    with pytest.raises(InputSpecError, match="Loss 'shape:0' is a int32 tensor"):
        TFNet.from_frozen_graph(graph.as_graph_def(), "x", "y", losses="shape")
    net = TFNet.from_keras(sparse_autoencoder())
    with pytest.raises(ValueError, match="takes no batch_size"):
        net.forward(X, return_losses=True, batch_size=8)
    plain = TFNet.from_frozen_graph(graph.as_graph_def(), "x", "y")
    assert plain.forward(np.ones((3, 2), np.float32), return_losses=True)[1] == 0.0
