"""Gradients that are right on every x86-64 CPU (issue 50), whatever CPU runs the test.

TensorFlow picks its convolution kernels by CPU and by ``TF_ENABLE_ONEDNN_OPTS``. oneDNN honours
``ONEDNN_MAX_CPU_ISA``, so one machine runs the AVX2-only kernels of an AMD Zen 3 (``ONEDNN_MAX_CPU_ISA=AVX2``),
its own best ones, and TensorFlow's own (oneDNN off), each in a fresh process. In each, ``tfnet.kernels.conv2d``
is compared with a float64 reference in value, input gradient and filter gradient, and PyTorch's default
ResNet export (a strided 1x1 downsample over 4 channels) and a temporal CNN (dilated 1-D convolutions) with
PyTorch's own gradients, and a Keras model's strided 1x1 convolution (one ``Conv2D`` op in its graph) against
float64, rewritten over a strided view exactly where the kernels need it. The raw ``Conv2D`` form of the wrong kernel
is printed beside, for the record, except where oneDNN runs its AVX2 kernels: there it is the wrong kernel, which
writes outside its buffers and aborts the process at one thread (the setting of a Spark task with one core, run here
too), so neither the self-check nor the test runs it."""

import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import environ_without_the_lane

pytest.importorskip("onnx")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: The children run at TensorFlow's own thread counts, as users run it, also from make test's one-core lane (which
#: sets these for its own process: tests/conftest.py): a kernel's sums are split by thread.
ENVIRON = environ_without_the_lane()

CHILD = textwrap.dedent("""
    import itertools, json
    import numpy as np
    import tensorflow as tf
    from tfnet import TFNet
    from tfnet.kernels import conv2d
    from tests.tfnet.onnx_fixtures import check_backward, check_forward, path_of

    rng = np.random.default_rng(0)

    def dilate(w, d):  # the float64 reference's dilated kernel: zeros between the taps
        k, c, o = w.shape[0], w.shape[2], w.shape[3]
        w = tf.pad(w[:, None, :, None], [[0, 0], [0, d - 1], [0, 0], [0, d - 1], [0, 0], [0, 0]])
        return tf.reshape(w, [k * d, k * d, c, o])[:(k - 1) * d + 1, :(k - 1) * d + 1]

    def raw(x, w, s, pad):
        kw = ({"explicit_paddings": [p for q in pad for p in q], "padding": "EXPLICIT"} if isinstance(pad, list)
              else {"padding": pad})
        return tf.raw_ops.Conv2D(input=x, filter=w, strides=[1, s, s, 1], data_format="NHWC", **kw)

    def value_and_grads(f, x, w, gy):
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            y = f(x, w)
            loss = tf.reduce_sum(y * tf.cast(gy, y.dtype))
        return [y] + tape.gradient(loss, [x, w])

    def rel(got, want):
        return max(float(np.abs(a.numpy() - b.numpy()).max() / np.abs(b.numpy()).max()) for a, b in zip(got, want))

    from tfnet import kernels
    checked = kernels.self_check()  # what optim's loop runs before training, in every setting
    worst, cases = 0.0, 0
    for h, c, k, s, d, pad in itertools.product([7, 8], [4, 9], [1, 3], [1, 2], [1, 2],
                                               ["VALID", "SAME", [[0, 0], [1, 0], [0, 2], [0, 0]]]):
        x, w = rng.standard_normal((2, h, h, c)), rng.standard_normal((k, k, c, 5))
        ref = lambda a, b: raw(a, dilate(b, d) if d > 1 else b, s, pad)
        gy = rng.standard_normal(ref(tf.constant(x), tf.constant(w)).shape)
        step = tf.function(lambda a, b: value_and_grads(lambda p, q: conv2d(p, q, [s, s], [d, d], pad), a, b, gy))
        got = step(tf.constant(x, tf.float32), tf.constant(w, tf.float32))
        worst = max(worst, rel(got, value_and_grads(ref, tf.constant(x), tf.constant(w), gy)))
        cases += 1

    # the raw form of the one wrong kernel found (AVX2 oneDNN): 1x1, stride 2, 4 input channels, 8x8; not where
    # oneDNN runs its AVX2 kernels, where it is that kernel, which writes outside its buffers (at one thread the
    # process aborts)
    x, w = rng.standard_normal((2, 8, 8, 4)), rng.standard_normal((1, 1, 4, 8))
    gy = rng.standard_normal((2, 4, 4, 8))
    f = lambda a, b: raw(a, b, 2, "VALID")
    raw_error = None if "raw_strided_1x1" not in checked else rel(
        value_and_grads(f, tf.constant(x, tf.float32), tf.constant(w, tf.float32), gy)[2:],
        value_and_grads(f, tf.constant(x), tf.constant(w), gy)[2:])

    # a Keras model: a strided 1x1 convolution is one Conv2D op in its graph, which tfnet rewrites; two of them read
    # the same input, as a ResNet block's shortcut and first convolution do, and share one strided view
    import keras
    inp = keras.Input((8, 8, 4))
    h = keras.layers.Add()([keras.layers.Conv2D(8, 1, strides=2)(inp), keras.layers.Conv2D(8, 1, strides=2)(inp)])
    model = keras.Model(inp, keras.layers.Conv2D(6, 3, strides=2, padding="same")(h))
    net = TFNet.from_keras(model)
    routed, rewritten = kernels.strided_1x1_routed(), net.state.graph.rewritten_convolutions
    views = sum(n.op == "StridedSlice" for n in net.state.graph.compute_template.node)
    x, gy = rng.standard_normal((2, 8, 8, 4)), rng.standard_normal((2, 2, 2, 6))
    ws = [tf.constant(w.astype("float64")) for w in model.get_weights()]
    with tf.GradientTape() as tape:
        tape.watch(ws)
        h = sum(tf.nn.bias_add(tf.nn.conv2d(tf.constant(x), k, 2, "VALID"), b) for k, b in (ws[0:2], ws[2:4]))
        loss = tf.reduce_sum(tf.nn.bias_add(tf.nn.conv2d(h, ws[4], 2, "SAME"), ws[5]) * gy)
    want = tape.gradient(loss, ws)
    got = net.backward(x.astype("float32"), gy.astype("float32"))[1]
    keras_worst = max(float(np.abs(g - w.numpy()).max() / np.abs(w.numpy()).max()) for g, w in zip(got.values(), want))

    # a grouped Conv2D (oneDNN differentiates it; TensorFlow's own kernel does not, so tfnet splits it then) and a
    # grouped Conv3D (no CPU kernel of either: always split), against float64 per-group references
    group_worst = 0.0
    for rank in (2, 3):
        spatial = (6,) * rank
        layer = (keras.layers.Conv2D if rank == 2 else keras.layers.Conv3D)(4, 3, groups=2, padding="same")
        inp = keras.Input((*spatial, 4))
        grouped = keras.Model(inp, layer(inp))
        net = TFNet.from_keras(grouped)
        x, gy = rng.standard_normal((2, *spatial, 4)), rng.standard_normal((2, *spatial, 4))
        k = tf.constant(grouped.get_weights()[0].astype("float64"))
        xs = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch([xs, k])
            conv = tf.nn.conv2d if rank == 2 else tf.nn.conv3d
            strides = [1] * (rank + 2)
            y = tf.concat([conv(a, b, strides, "SAME") for a, b in zip(tf.split(xs, 2, -1), tf.split(k, 2, -1))], -1)
            loss = tf.reduce_sum(y * gy)
        want_x, want_k = tape.gradient(loss, [xs, k])
        got_x, got_w = net.backward(x.astype("float32"), gy.astype("float32"))
        got_k = [v for name, v in got_w.items() if name.endswith("kernel")][0]
        group_worst = max(group_worst,
                          max(float(np.abs(a - b).max() / np.abs(b).max())
                              for a, b in ((got_x, want_x.numpy()), (got_k, want_k.numpy()))))

    for name in ("dyn_resnet", "tcn"):
        net = TFNet.from_onnx(path_of(name))
        check_forward(net, name)
        check_backward(net, name)
    print(json.dumps({"cases": cases, "worst": worst, "keras_worst": keras_worst, "group_worst": group_worst,
                      "raw_1x1_stride_2": raw_error, "routed": routed, "rewritten": rewritten, "views": views,
                      "checked": checked}))
""")

SETTINGS = {
    "onednn_avx2": {"TF_ENABLE_ONEDNN_OPTS": "1", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    # a Spark task with one core on a Zen 3: tfnet's rank sets TensorFlow's pools to the task's cores
    "onednn_avx2_one_thread": {"TF_ENABLE_ONEDNN_OPTS": "1", "ONEDNN_MAX_CPU_ISA": "AVX2",
                               "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"},
    "onednn_best": {"TF_ENABLE_ONEDNN_OPTS": "1", "ONEDNN_MAX_CPU_ISA": "ALL"},
    "onednn_off": {"TF_ENABLE_ONEDNN_OPTS": "0"},
}


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_convolution_gradients_match_float64_and_pytorch(setting):
    import json

    from tfnet.precision import cpu_flags

    env = dict(ENVIRON, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", **SETTINGS[setting])
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    cpu = sorted(cpu_flags() & {"avx2", "avx512f", "avx512_bf16", "amx_bf16"})
    print(f"{setting} on {cpu}: {result}")
    assert result["cases"] == 96
    assert result["worst"] < 1e-5, result  # float32 against float64: a few roundings
    assert result["keras_worst"] < 1e-5 and result["group_worst"] < 1e-5, result
    # the strided view is taken where oneDNN runs its AVX2 kernels (the wrong ones) or the raw kernel measured wrong,
    # and only there: elsewhere the Keras model's strided 1x1 Conv2D runs as it is (and its gradient is right above)
    avx2_kernels = setting.startswith("onednn_avx2") or (setting == "onednn_best" and "avx512f" not in cpu_flags())
    assert result["routed"] == (avx2_kernels or result["raw_1x1_stride_2"] >= 1e-4), result
    # the self-check's forms are right, and it never ran the AVX2 kernel it routes around
    assert max(v for k, v in result["checked"].items() if not k.startswith("raw")) < 1e-5, result
    assert ("raw_strided_1x1" in result["checked"]) == (not avx2_kernels), result
    assert result["rewritten"] == (2 if result["routed"] else 0), result
    assert result["views"] == (1 if result["routed"] else 0), result  # one view of the input for both


def test_the_self_check_stops_training_on_a_cpu_with_a_wrong_kernel(monkeypatch):
    """``optim``'s loop calls ``tfnet.kernels.self_check`` before the first step: a form of tfnet's own that comes out
    wrong (simulated in a fresh process: a convolution 1% off, without the dilation route) stops training with
    KernelCheckError naming the fix; the real forms pass on this CPU."""
    from tfnet import kernels

    assert all(v < 1e-5 for k, v in kernels.self_check().items() if not k.startswith("raw")), kernels.self_check()
    child = textwrap.dedent('''
        import numpy as np
        from tfnet import kernels
        kernels.conv2d = lambda x, w, s, d, p: 1.01 * kernels._raw(x, w, s, d, p)  # a kernel 1% off, and no dilation
        import optim
        from optim import TFOptimizer
        from tests.models import small_cnn
        from tfnet import TFNet, KernelCheckError
        opt = TFOptimizer(TFNet.from_keras(small_cnn()), "sparse_categorical_crossentropy", optim.SGD(0.1))
        try:
            opt.optimize((np.zeros((4, 8, 8, 3), np.float32), np.zeros(4, np.int64)), batch_size=2, verbose=0)
        except KernelCheckError as exc:
            print("REFUSED", opt.global_step, str(exc))
    ''')
    env = dict(ENVIRON, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", **SETTINGS["onednn_avx2"])
    done = subprocess.run([sys.executable, "-c", child], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert "REFUSED 0 TensorFlow's CPU kernels compute a wrong convolution gradient here" in done.stdout, (
        done.stdout[-2000:] + done.stderr[-3000:])
    assert "TF_ENABLE_ONEDNN_OPTS=0" in done.stdout and "{'strided_1x1': " in done.stdout  # what is wrong, and the fix
