"""A trainable Keras ``BatchNormalization`` while tfnet trains, as Keras's ``fit`` runs it: in the training step it
normalizes by the batch's statistics and its moving mean and variance move (``moving * momentum + batch * (1 -
momentum)``, the net's ``updates``); forward, predict and evaluation use the moving ones. The oracle is Keras itself:
``fit``'s weights and history, ``model(x, training=True)``'s assignments. Before, tfnet trained it in inference mode
(moving statistics fixed) with a warning: the transfer guide's base, unfrozen whole, ended 2.6e-2 from ``fit``'s
weights after one epoch."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import optim
from optim import TFOptimizer
from optim.errors import KerasTrainingWarning
from tests.models import _randomise_bn, small_cnn
from tests.optim.keras_transfer import data, max_diff, transfer_model
from tfnet import TFNet
from tfnet.errors import InputSpecError, TensorNameError
from tfnet.serialize import net_from_bytes, net_to_bytes

SCE = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def dense_bn(seed=0):
    """Batch norm after a Dense layer (axis -1 of a 2-D tensor) and after a convolution, with momentum 0.9. Neither
    has a bias, as usual before a batch norm: the true gradient of such a bias is 0 (the batch norm subtracts the
    batch's mean), so its computed one is rounding noise, which Adam scales up to its learning rate on both sides."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8, 8, 3), name="img")
    x = keras.layers.Conv2D(4, 3, use_bias=False, name="conv")(inputs)
    x = keras.layers.BatchNormalization(momentum=0.9, name="bn_conv")(x)
    x = keras.layers.GlobalAveragePooling2D()(keras.layers.Activation("relu")(x))
    x = keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-2, name="bn_dense")(keras.layers.Dense(5, use_bias=False, name="d")(x))
    model = keras.Model(inputs, keras.layers.Dense(3, name="out")(keras.layers.Activation("tanh")(x)))
    _randomise_bn(model, seed)
    return model


@pytest.mark.parametrize("build,optimizer", [(lambda: small_cnn(classes=3), lambda: keras.optimizers.SGD(0.05)),
                                             (dense_bn, lambda: keras.optimizers.Adam(0.01))], ids=["cnn-sgd", "dense-adam"])
def test_a_trainable_batch_norm_trains_as_fit(build, optimizer):
    x, y = data(48)
    xv, yv = data(16, seed=1)
    reference, model = build(), build()
    initial = {v.path: v.numpy() for v in model.weights}
    for m in (reference, model):
        m.compile(optimizer=optimizer(), loss=SCE)
    fits = dict(batch_size=8, epochs=2, shuffle=False, validation_data=(xv, yv), verbose=0)
    theirs = reference.fit(x, y, **fits).history
    with warnings.catch_warnings():  # nothing to say: it trains as fit does
        warnings.simplefilter("error", KerasTrainingWarning)
        opt = TFOptimizer.from_keras(model)
    assert sorted(opt.net.updates.values()) == sorted(v.path for v in model.non_trainable_weights)
    ours = opt.optimize((x, y), **fits)
    want = {v.path: v.numpy() for v in reference.weights}
    assert max_diff(opt.net, want) < 1e-6
    for k in opt.net.updates.values():  # the moving statistics moved, as fit moved them
        assert np.abs(want[k] - initial[k]).max() > 1e-3, k
    for key in ("loss", "val_loss"):
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-5, err_msg=key)
    # inference: the moving statistics, as Keras's predict
    np.testing.assert_allclose(opt.net.forward(xv), reference.predict(xv, verbose=0), rtol=1e-5, atol=1e-6)


def test_a_nested_base_unfrozen_trains_its_batch_norm_as_fit():
    """Keras's transfer guide's base, unfrozen whole (its batch norm too) though called with ``training=False``:
    Keras 3's ``fit`` runs a nested model in training mode whatever the call said, and so does tfnet's step."""
    x, y = data(32)
    reference, ref_base = transfer_model()
    model, base = transfer_model()
    for m, b in ((reference, ref_base), (model, base)):
        b.trainable = True
        m.compile(optimizer=keras.optimizers.SGD(0.05), loss=SCE)
    reference.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    opt = TFOptimizer.from_keras(model)
    opt.optimize((x, y), batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert max_diff(opt.net, {v.path: v.numpy() for v in reference.weights}) < 1e-6


def test_the_updates_go_wherever_the_net_goes(tmp_path):
    """One training step of the net, saved and loaded, serialized, with adapters, merged, cut and extended: the
    moving statistics take what Keras's ``model(x, training=True)`` assigns."""
    x, y = data(8)
    model, reference = transfer_model()[0], transfer_model()[0]
    for m in (model, reference):
        m.get_layer("base").trainable = True
    reference(x, training=True)  # Keras's call assigns the batch's moving statistics
    want = {v.path: v.numpy() for v in reference.non_trainable_weights}
    net = TFNet.from_keras(model, train_batch_norm=True)
    assert sorted(net.updates.values()) == sorted(want)
    net.save(str(tmp_path / "saved"))
    features = net.cut("base")
    loss = optim.losses.get(SCE)
    for other in (net, TFNet.load(str(tmp_path / "saved")), net_from_bytes(net_to_bytes(net)),
                  net.with_lora("head/kernel", rank=1, seed=0), net.with_lora("head/kernel", rank=1).merged(),
                  features.add_head(keras.layers.Dense(3, name="d"), name="h2")):
        assert sorted(other.updates.values()) == sorted(want)
        before = other.forward(x)
        other.train_step(loss, 1e-9).run(x, y)  # a rate of 1e-9: only the updates change the net (to 1e-6)
        got = other.get_weights(list(want))
        assert max(float(np.abs(got[k] - want[k]).max()) for k in want) < 1e-6
        assert np.abs(other.forward(x) - before).max() > 1e-3
    np.testing.assert_allclose(net.forward(x), reference(x, training=False), rtol=1e-5, atol=1e-6)
    # cut before the batch norm: no statistic left to update
    conv = next(n.name for n in net.template.node if n.op == "Conv2D")
    assert net.cut(conv).updates == {} and "base/bn/moving_mean" not in net.cut(conv).weight_names


def test_inference_runs_the_graph_without_the_switches():
    """Where the batch norm is switched for training, forward runs the inference graph: the batch norms fold into
    their convolutions as without the switches, with the same result bit for bit; and so does its frozen graph
    loaded without the phase (the graph ``frozen_graph_def`` writes keeps the switches, at their default)."""
    model = small_cnn()
    plain, switched = TFNet.from_keras(model), TFNet.from_keras(model, train_batch_norm=True)
    assert switched.graph.inference_template is not None and plain.graph.inference_template is None
    assert switched.graph.folded == plain.graph.folded == 1
    x = data(5)[0]
    np.testing.assert_array_equal(switched.forward(x), plain.forward(x))
    assert not plain.updates and plain.phase_values == {}
    # its frozen graph loaded as a plain one: nothing feeds the phase, so the switches are taken out and it folds
    loaded = TFNet.from_frozen_graph(switched.frozen_graph_def(), switched.input_names, switched.output_names)
    assert loaded.graph.folded == 1 and not loaded.phase_values
    np.testing.assert_array_equal(loaded.forward(x), plain.forward(x))


def test_a_heads_batch_norm_trains_as_fit_with_train_batch_norm():
    """``add_head(..., train_batch_norm=True)``: a new head's batch norm trained over a frozen base as Keras's ``fit``
    trains the same head on the base's features (its moving statistics move); without it, inference mode (they stay)."""
    base = TFNet.from_keras(small_cnn(classes=4))
    x, y = data(32)
    features = base.forward(x)

    def head():
        return [keras.layers.Dense(5, use_bias=False, name="d"), keras.layers.BatchNormalization(momentum=0.9, name="bn"),
                keras.layers.Activation("tanh"), keras.layers.Dense(3, name="out")]

    inputs = keras.Input((4,))
    layers = head()
    outputs = inputs
    for layer in layers:
        outputs = layer(outputs)
    reference = keras.Model(inputs, outputs)
    _randomise_bn(reference, 1)
    reference.compile(optimizer=keras.optimizers.SGD(0.1), loss=SCE)
    start = {v.path: v.numpy() for v in reference.weights}
    nets = {flag: base.add_head(head(), train_batch_norm=flag) for flag in (True, False)}
    for net in nets.values():
        net.set_weights({f"head/{k}": v for k, v in start.items()})
        net.trainable = "head/"
    assert sorted(nets[True].updates.values()) == ["head/bn/moving_mean", "head/bn/moving_variance"]
    assert nets[False].updates == {}
    reference.fit(features, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    want = {f"head/{v.path}": v.numpy() for v in reference.weights}
    for flag, net in nets.items():
        TFOptimizer(net, SCE, optim.SGD(0.1)).optimize((x, y), batch_size=8, epochs=2, shuffle=False, verbose=0)
        got = net.get_weights(list(want))
        diff = max(float(np.abs(got[k] - want[k]).max()) for k in want)
        assert (diff < 1e-6) if flag else (diff > 1e-3), (flag, diff)


def test_the_training_step_leaves_the_inference_output_uncomputed():
    """Each switched batch norm's inference output is computed outside its switch and read only by the inference
    branch; the training step's graphs give the switch an unread stand-in instead, so nothing the step returns
    depends on it and TensorFlow prunes it and its gradient (about a tenth of an EfficientNet-B0 step,
    docs/benchmarks.md). The step's values are fit's: the tests above run through these graphs."""
    from tfnet import graph_utils as gu
    from tfnet.keras_training import _read_arguments

    g = TFNet.from_keras(small_cnn(), train_batch_norm=True).graph
    functions = {f.signature.name: f for f in g.compute_template.library.function}
    switches = [n for n in g.compute_template.node if n.op in ("If", "StatelessIf")]
    unread = [n.input[1 + k] for n in switches for k in range(len(n.attr["Tin"].list.type))
              if k not in _read_arguments(functions[n.attr["then_branch"].func.name])]
    assert len(switches) == 1 and len(unread) == 1  # the one batch norm's inference output
    returned = list(g.output_names) + list(g.update_names)
    feeds = list(g.input_names) + [w + ":0" for w in g.weight_names] + list(g.phase_values)
    ancestors = lambda template: {n.name for n in gu.subgraph(template, returned, feeds=feeds).node}  # noqa: E731
    assert gu.node_name(unread[0]) in ancestors(g.compute_template) & ancestors(g.gradient_template)
    assert all(gu.node_name(unread[0]) not in ancestors(t) for t in g.training_templates)
    assert TFNet.from_keras(small_cnn()).graph.training_templates is None  # nothing switched: nothing to leave


def test_a_step_whose_loss_is_not_finite_leaves_the_statistics():
    model = small_cnn(classes=3)
    net = TFNet.from_keras(model, train_batch_norm=True)
    before = net.get_weights()
    x, y = data(8)
    x[0, 0, 0, 0] = np.nan
    result = net.train_step(optim.losses.get(SCE), 0.1).run(x, y)
    assert not bool(result.finite)
    for k, v in net.get_weights().items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)


def test_wrong_updates_are_said():
    net = TFNet.from_keras(small_cnn())
    graph, out = net.frozen_graph_def(), net.output_names
    with pytest.raises(TensorNameError, match="nope"):
        TFNet(graph, "img", out, updates={"nope:0": "bn/moving_mean"})
    with pytest.raises(TensorNameError, match="moving_meen"):
        TFNet(graph, "img", out, updates={"relu:0": "bn/moving_meen"})
    with pytest.raises(InputSpecError, match="takes a dict"):
        TFNet(graph, "img", out, updates=["relu:0"])
    with pytest.raises(InputSpecError, match=r"shape \(None, 6, 6, 4\).*bn/moving_mean.*\(4,\)"):
        TFNet(graph, "img", out, updates={"relu:0": "bn/moving_mean"})


def test_a_tf1_graphs_batch_norm_updates_train_as_its_session():
    """A TF1 graph with a training-mode ``fused_batch_norm`` and its moving averages' new values as tensors, frozen by
    TensorFlow's own converter; given as ``updates=``, tfnet's steps equal the Session's GradientDescent steps run
    with the assignments in ``UPDATE_OPS``, moving statistics included."""
    v1 = tf.compat.v1
    rng = np.random.default_rng(3)
    x_np = rng.normal(1.0, 2.0, size=(24, 2, 2, 3)).astype(np.float32)
    y_np = rng.normal(size=(24, 3)).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, (None, 2, 2, 3), name="x")
        y = v1.placeholder(tf.float32, (None, 3), name="y")
        scale = v1.get_variable("scale", initializer=rng.uniform(0.5, 1.5, (3,)).astype(np.float32))
        gamma = v1.get_variable("bn/gamma", initializer=np.ones(3, np.float32))
        beta = v1.get_variable("bn/beta", initializer=np.zeros(3, np.float32))
        mean = v1.get_variable("bn/moving_mean", initializer=np.zeros(3, np.float32), trainable=False)
        var = v1.get_variable("bn/moving_variance", initializer=np.ones(3, np.float32), trainable=False)
        h, batch_mean, batch_var = v1.nn.fused_batch_norm(x * scale, gamma, beta, is_training=True)
        new_mean = tf.identity(mean * 0.9 + batch_mean * 0.1, name="new_mean")
        new_var = tf.identity(var * 0.9 + batch_var * 0.1, name="new_var")
        v1.add_to_collection(v1.GraphKeys.UPDATE_OPS, mean.assign(new_mean))
        v1.add_to_collection(v1.GraphKeys.UPDATE_OPS, var.assign(new_var))
        out = tf.reduce_mean(tf.nn.relu(h), axis=[1, 2], name="out")
        loss = tf.reduce_mean(tf.square(out - y))
        with tf.control_dependencies(v1.get_collection(v1.GraphKeys.UPDATE_OPS)):
            train = v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        names = ["scale", "bn/gamma", "bn/beta", "bn/moving_mean", "bn/moving_variance"]
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            frozen = v1.graph_util.convert_variables_to_constants(sess, graph.as_graph_def(),
                                                                  ["out", "new_mean", "new_var"])
            for k in range(3):
                sess.run(train, {x: x_np[8 * k:8 * k + 8], y: y_np[8 * k:8 * k + 8]})
            want = dict(zip(names, sess.run([scale, gamma, beta, mean, var])))
    net = TFNet.from_frozen_graph(frozen, "x", "out", weights=names,  # not the batch norm's empty constants
                                  updates={"new_mean": "bn/moving_mean", "new_var": "bn/moving_variance"})
    assert net.trainable == ["scale", "bn/gamma", "bn/beta"]  # what the step assigns is not trained by gradients
    TFOptimizer(net, optim.losses.get("mse"), optim.SGD(0.1)).optimize((x_np, y_np), batch_size=8, shuffle=False,
                                                                      verbose=0)
    got = net.get_weights(names)
    for k in names:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert np.abs(want["bn/moving_mean"]).max() > 0.1
