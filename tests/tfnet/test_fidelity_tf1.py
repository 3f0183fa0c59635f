"""TF1 graphs frozen with ``tf.compat.v1.graph_util.convert_variables_to_constants``, loaded from a
``.pb`` and checked against a v1 ``Session`` (``tf.gradients`` and an SGD step there): v1 and v2
loops and conds, fused batch norm, an embedding lookup and a string input parsed in the graph."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from tests.tfnet import fidelity as fd
from tests.tfnet import tf1_graphs
from tfnet import TFNet
from tfnet.errors import GradientUnavailableError, InputSpecError, TensorNameError


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(tmp_path_factory.mktemp("fidelity_tf1"))


@pytest.mark.parametrize("name", list(tf1_graphs.BUILDERS))
def test_tf1_graph_matches_session(folder, name):
    case = tf1_graphs.freeze_tf1(name, folder)
    net, _ = fd.compare(case)
    expected = {"fused_batch_norm": {"bn/mean": "mean", "bn/var": "variance"}}.get(name, {})
    assert net.statistics == expected, f"{case.where()} statistics {net.statistics}"


@pytest.mark.parametrize("name", ["rnn_while_v2", "cond_v2"])
def test_function_library_survives_cut_fold_and_save(folder, tmp_path, name):
    """While / If call library functions: they must survive subgraph extraction, batch-norm
    folding (on by default) and saving, and run in a process that never saw them."""
    case = tf1_graphs.freeze_tf1(name, folder)
    net = TFNet.from_frozen_graph(case.pb, case.inputs, case.outputs)
    graph = tf.compat.v1.GraphDef()
    with open(case.pb, "rb") as f:
        graph.ParseFromString(f.read())
    calls = [n.op for n in graph.node if n.op in ("While", "StatelessWhile", "If", "StatelessIf")]
    assert calls, f"[{name}] the fixture should call library functions"
    # cut just before the output Identity: the call stays inside the subgraph
    last = [n for n in graph.node if n.name == case.outputs[0].split(":")[0]][0]
    cut = net.cut(last.input[0])
    np.testing.assert_allclose(cut.forward(case.oracle.x), case.oracle.y, rtol=1e-5, atol=1e-6)
    net.save(str(tmp_path / "saved"))
    loaded = TFNet.from_export_folder(str(tmp_path / "saved"))
    assert len(loaded.frozen_graph_def().library.function) == len(graph.library.function)
    np.testing.assert_allclose(loaded.forward(case.oracle.x), case.oracle.y, rtol=1e-5, atol=1e-6)
    # a fresh process (where no function of that name was ever registered) runs it too
    np.save(str(tmp_path / "x.npy"), case.oracle.x)
    script = textwrap.dedent(f"""
        import numpy as np
        from tfnet import TFNet
        net = TFNet.from_export_folder({str(tmp_path / "saved")!r})
        x = np.load({str(tmp_path / "x.npy")!r})
        gx, gw = net.backward(x)
        print(float(np.abs(net.forward(x)).sum()), len(gw))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, f"[{name}] fresh process failed: {out.stderr[-2000:]}"
    total, n_grads = out.stdout.split()[-2:]
    assert abs(float(total) - np.abs(case.oracle.y).sum()) < 1e-4 * max(1.0, float(total)), f"[{name}]"
    assert int(n_grads) == len(case.oracle.trainable), f"[{name}]"


def test_v1_loop_loads_and_runs_under_an_address_space_limit(folder, tmp_path):
    """A v1 loop is a cycle (NextIteration feeds Merge): loading must not loop. Under a 2 GiB
    address-space limit (TensorFlow itself imports within it) the RNN loads, runs forward and
    backward, in a bounded time."""
    case = tf1_graphs.freeze_tf1("rnn_while_v1", folder)
    np.save(str(tmp_path / "x.npy"), case.oracle.x)
    np.save(str(tmp_path / "g.npy"), case.oracle.grad_out.astype(np.float32))
    script = textwrap.dedent(f"""
        import json, resource, time
        limit = 2 * 1024 ** 3
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        import numpy as np
        from tfnet import TFNet
        t0 = time.time()
        net = TFNet.from_frozen_graph({case.pb!r}, {case.inputs!r}, {case.outputs!r})
        x = np.load({str(tmp_path / "x.npy")!r})
        y = net.forward(x)
        gx, gw = net.backward(x, np.load({str(tmp_path / "g.npy")!r}))
        peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({{"y": y.tolist(), "gx": gx.tolist(), "seconds": time.time() - t0, "peak_kb": peak_kb}}))
    """)
    env = dict(os.environ, TF_NUM_INTEROP_THREADS="1")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, f"[rnn_while_v1 via converter] failed under 2 GiB: {out.stderr[-2000:]}"
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert fd.rel_error(result["y"], case.oracle.y) <= fd.FORWARD_TOL, "[rnn_while_v1 via converter] forward"
    assert fd.rel_error(result["gx"], case.oracle.grad_x) <= fd.GRADIENT_TOL, "[rnn_while_v1 via converter] grad"


def test_fused_step_on_v1_loops_equals_backward_and_apply(folder):
    """The fused step differentiates v1 loops too: one step equals backward + apply_updates."""
    case = tf1_graphs.freeze_tf1("rnn_while_v1", folder)
    fused = TFNet.from_frozen_graph(case.pb, case.inputs, case.outputs)
    manual = TFNet.from_frozen_graph(case.pb, case.inputs, case.outputs)
    g = case.oracle.grad_out.astype(np.float32)
    step = fused.train_step(lambda t, y: tf.reduce_sum(y * t), 0.05)
    result = step(case.oracle.x, g, step.init_state())
    assert bool(result.finite)
    _, gw = manual.backward(case.oracle.x, g)
    manual.apply_updates({n: -0.05 * v for n, v in gw.items()})
    for name, value in manual.get_weights().items():
        np.testing.assert_allclose(fused.get_weights()[name], value, rtol=1e-5, atol=1e-6,
                                   err_msg=f"[rnn_while_v1 via converter] weight {name}")


def test_a_v1_loop_output_given_none_counts_nothing_as_in_a_session():
    """Two outputs of one v1 loop, the second given ``None``: ``backward`` equals a v1 ``Session``'s
    ``tf.gradients`` of the first alone, on the input and on each weight (constants the net turns into weights)."""
    v1 = tf.compat.v1
    rng = np.random.default_rng(3)
    x0 = rng.normal(size=(2, 3)).astype(np.float32)
    g0 = rng.normal(size=(2, 2)).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default(), tf1_graphs.control_flow(1):
        x = v1.placeholder(tf.float32, [None, 3], name="x")
        w = tf.constant(rng.normal(size=(3, 3)).astype(np.float32) * 0.5, name="W")
        v = tf.constant(rng.normal(size=(3, 2)).astype(np.float32), name="V")
        _, h = tf.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, tf.tanh(tf.matmul(h, w))), [0, x])
        y = tf.identity(tf.matmul(h, v), name="y")
        tf.identity(tf.reduce_sum(tf.square(h), axis=1, keepdims=True), name="z")
        expected = tf.gradients(y, [x, w, v], grad_ys=g0)
        with v1.Session(graph=graph) as session:
            gx_expected, gw_expected, gv_expected = session.run(expected, {x: x0})
    net = TFNet.from_frozen_graph(graph.as_graph_def(), "x", ["y", "z"])
    assert net.graph.v1_loops and set(net.trainable) == {"W", "V"}
    gx, gw = net.backward(x0, [g0, None])
    np.testing.assert_allclose(gx, gx_expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gw["W"], gw_expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gw["V"], gv_expected, rtol=1e-5, atol=1e-6)


def test_nested_v1_loops_are_a_typed_error_naming_the_node(tmp_path):
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default(), tf1_graphs.control_flow(1):
        x = v1.placeholder(tf.float32, [None, 2], name="x")
        w = tf.constant([[1.0, 0.5], [0.0, 1.0]], name="W")

        def outer(i, h):
            _, h = tf.while_loop(lambda j, h: j < 2, lambda j, h: (j + 1, tf.tanh(tf.matmul(h, w))), [0, h])
            return i + 1, h

        _, h = tf.while_loop(lambda i, h: i < 2, outer, [0, x])
        tf.identity(h, name="y")
    net = TFNet.from_frozen_graph(graph.as_graph_def(), "x", "y")
    x0 = np.ones((1, 2), np.float32)
    expected = x0
    for _ in range(4):
        expected = np.tanh(expected @ net.get_weights()["W"])
    np.testing.assert_allclose(net.forward(x0), expected, rtol=1e-5)  # forward works
    with pytest.raises(GradientUnavailableError, match=r"Node '.*while.*' belongs to two v1 loops"):
        net.backward(x0)


# ----------------------------------------------------------------------------- phase values


def _dropout_graph(tmp_path):
    """``y = dropout(x W)`` when ``is_training``, else ``x W`` (a tf.cond: an If op)."""
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 8], name="x")
        is_training = v1.placeholder(tf.bool, [], name="is_training")
        w = tf.constant(np.random.default_rng(0).normal(size=(8, 64)).astype(np.float32), name="W")
        h = tf.matmul(x, w)
        tf.identity(tf.cond(is_training, lambda: tf.nn.dropout(h, rate=0.5), lambda: h), name="y")
    path = str(tmp_path / "dropout.pb")
    with open(path, "wb") as f:
        f.write(graph.as_graph_def().SerializeToString())
    return path


def test_phase_values_select_training_and_inference_values(tmp_path):
    pb = _dropout_graph(tmp_path)
    net = TFNet.from_frozen_graph(pb, "x", "y", phase_values={"is_training": (True, False)})
    assert net.phase_values == {"is_training:0": (True, False)}
    x = np.random.default_rng(1).normal(size=(2, 8)).astype(np.float32)
    expected = x @ net.get_weights()["W"]
    a, b = net.forward(x), net.forward(x)
    np.testing.assert_array_equal(a, b)  # inference: deterministic
    np.testing.assert_allclose(a, expected, rtol=1e-5, atol=1e-5)
    t1, t2 = net.forward(x, training=True), net.forward(x, training=True)
    assert not np.array_equal(t1, t2), "training mode should drop different units each call"
    dropped = np.mean(t1 == 0)
    assert 0.2 < dropped < 0.8, f"dropout rate 0.5 dropped {dropped:.2f}"
    kept = t1 != 0
    np.testing.assert_allclose(t1[kept], 2 * expected[kept], rtol=1e-5)
    # the fused training step runs in training mode
    step = net.train_step(lambda t, y: tf.reduce_sum(y * 0.0), 0.1)
    result = step(x, np.zeros((2, 64), np.float32), step.init_state())
    assert np.mean(result.outputs.numpy() == 0) > 0.2, "the training step should see dropout"
    # saved and loaded, the phase values come back
    net.save(str(tmp_path / "saved"))
    loaded = TFNet.from_export_folder(str(tmp_path / "saved"))
    assert loaded.phase_values == {"is_training:0": (True, False)}
    np.testing.assert_array_equal(loaded.forward(x), a)
    # and so they do when the net is shipped to Spark workers as bytes
    from tfnet.serialize import net_from_bytes, net_to_bytes

    shipped = net_from_bytes(net_to_bytes(net))
    assert shipped.phase_values == {"is_training:0": (True, False)}
    assert shipped.statistics == net.statistics
    assert np.mean(shipped.forward(x, training=True) == 0) > 0.2


def test_phase_values_errors(tmp_path):
    pb = _dropout_graph(tmp_path)
    with pytest.raises(TensorNameError, match="Unknown phase tensor 'is_trainin'"):
        TFNet.from_frozen_graph(pb, "x", "y", phase_values={"is_trainin": (True, False)})
    with pytest.raises(InputSpecError, match=r"must be a pair \(training value, inference value\)"):
        TFNet.from_frozen_graph(pb, "x", "y", phase_values={"is_training": True})
    with pytest.raises(InputSpecError, match=r"each a bool of shape \(\)\. Received: \[1, 2\]"):
        TFNet.from_frozen_graph(pb, "x", "y", phase_values={"is_training": ([1, 2], False)})
    with pytest.raises(InputSpecError, match="depend on placeholders \\['is_training'\\]"):
        TFNet.from_frozen_graph(pb, "x", "y")


def test_predictor_serves_a_net_with_phase_values(tmp_path):
    """TFPredictor ships the graph with the inference values baked in: it needs no phase feed and
    equals net.forward (inference mode, deterministic)."""
    from optim import TFPredictor

    pb = _dropout_graph(tmp_path)
    net = TFNet.from_frozen_graph(pb, "x", "y", phase_values={"is_training": (True, False)})
    x = np.random.default_rng(1).normal(size=(6, 8)).astype(np.float32)
    with TFPredictor(net) as predictor:
        out = predictor.predict(x)
    np.testing.assert_allclose(np.asarray(out), net.forward(x), rtol=1e-6)
    baked = TFNet.from_frozen_graph(net.frozen_graph_def(phase="training"), "x", "y")
    assert np.mean(baked.forward(np.ones((4, 8), np.float32)) == 0) > 0.2, "training values were not baked in"
    with pytest.raises(ValueError, match="`phase` must be None, 'inference' or 'training'. Received: phase='eval'"):
        net.frozen_graph_def(phase="eval")
