"""benchmarks/bench_conv_kernels.py times what it says: ResNet-50's convolutions as the step runs them (Keras's model,
53 of them, its FLOP; strided 1x1 ones as tfnet's strided view where tfnet takes it), each kernel the convolution it
names (against a float64 ``tf.GradientTape``), each matmul im2col's GEMM of the same FLOP, and the sums weighted by
how often a shape occurs."""

import collections
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.benchmark_files import load
from tfnet.kernels import strided_1x1_routed


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the benchmarks put their folder first; not for later tests
    return load("bench_conv_kernels")


def test_resnet50s_convolutions_are_the_models_as_the_step_runs_them(bench):
    import keras
    from tensorflow.python.framework import ops

    convs = bench.resnet50_convolutions(224, 16)
    assert sum(convs.values()) == 53
    (stem,) = [c for c in convs if c.reads_image]
    assert (stem.height, stem.cin, stem.kh, stem.cout, stem.stride, stem.padding) == (230, 3, 7, 64, 2, "VALID"), stem
    assert convs[bench.Conv(16, 7, 7, 512, 3, 3, 512, 1, "SAME")] == 3  # the last stage's three 3x3 convolutions
    # TensorFlow's own FLOP count (the profiler's statistics) of Keras's ResNet-50, an image: its convolutions, the
    # dense layer, and the constant the other benchmarks' shares of a ceiling divide by
    model = keras.applications.ResNet50(weights=None)
    graph = tf.function(model).get_concrete_function(tf.TensorSpec([1, 224, 224, 3])).graph
    counted = collections.Counter()
    for op in graph.get_operations():
        if op.type in ("Conv2D", "MatMul"):
            counted[op.type] += ops.get_stats_for_node_def(graph, op.node_def, "flops").value / 1e9
    assert sum(n * bench.gflop(c) for c, n in convs.items()) / 16 == pytest.approx(counted["Conv2D"], rel=1e-9)
    common = load("common")
    assert counted["Conv2D"] + counted["MatMul"] == pytest.approx(common.RESNET50_GFLOP, abs=5e-4)
    assert bench.gflop(stem) / 16 == pytest.approx(common.RESNET50_STEM_GFLOP, abs=5e-4)
    strided_1x1 = [c for c in convs if c.kh == c.kw == 1 and c.stride > 1]
    if strided_1x1_routed():  # the view at stride 1, at the strided size: 28x28 from 56x56
        assert not strided_1x1 and convs[bench.Conv(16, 28, 28, 256, 1, 1, 512, 1, "VALID")] == 1
    else:
        assert len(strided_1x1) == 6 and convs[bench.Conv(16, 56, 56, 256, 1, 1, 512, 2, "VALID")] == 1


def test_a_steps_kernels_are_the_steps_flop(bench, monkeypatch):
    """The three kinds summed over the model are a training step's FLOP less the dense layer's, as the benchmarks'
    shares of a ceiling count them: no input gradient for the first convolution. (The kernels are not run: a second
    each.)"""
    monkeypatch.setattr(bench, "interleaved", lambda fns, rounds: {name: [1.0] for name in fns})
    convs = bench.resnet50_convolutions(224, 1)
    r = bench.measure(convs, tf.float32, rounds=1)
    common = load("common")
    dense = 3 * 2 * 2048 * 1000 / 1e9
    assert r["gflop"] == pytest.approx(common.resnet50_gflop(224, training=True) - dense, abs=5e-4)
    assert r["conv_s"] == 3 * 53 - 1
    assert r["kinds"]["input_gradient"]["gflop"] == pytest.approx(
        r["kinds"]["forward"]["gflop"] - sum(bench.gflop(c) for c in convs if c.reads_image))
    assert [row for row in r["shapes"] if row["shape"]["reads_image"] and "input_gradient" in row] == []


SHAPES = [(2, 6, 6, 3, 3, 3, 4, 1, "SAME"), (2, 9, 9, 2, 3, 3, 5, 2, "VALID"), (1, 5, 7, 4, 1, 1, 6, 1, "VALID")]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[4]}x{s[5]}/{s[7]}-{s[8]}")
def test_each_kernel_is_the_convolution_it_names_and_its_matmul_the_same_gemm(bench, shape):
    c = bench.Conv(*shape)
    x, w, dy = (tf.cast(t, tf.float64) for t in bench.operands(c, tf.float32))
    with tf.GradientTape() as tape:
        tape.watch([x, w])
        y = tf.nn.conv2d(x, w, c.stride, c.padding)
    want = dict(zip(bench.KINDS, [y, *tape.gradient(y, [x, w], output_gradients=dy)]))
    ho, wo = y.shape[1:3]
    assert bench.output_size(c) == (ho, wo)
    pixels, window = c.batch * ho * wo, c.kh * c.kw * c.cin
    assert bench.gemm_shapes(c) == {"forward": (pixels, window, c.cout), "input_gradient": (pixels, c.cout, window),
                                    "filter_gradient": (window, pixels, c.cout)}
    assert bench.gflop(c) == 2 * pixels * window * c.cout / 1e9
    for kind, (conv, matmul) in bench.kernels(c, tf.float32).items():
        got = conv().numpy()
        assert got.shape == want[kind].shape, kind
        np.testing.assert_allclose(got, want[kind].numpy(), rtol=1e-5, atol=1e-5, err_msg=kind)
        assert matmul().shape == bench.gemm_shapes(c)[kind][::2], kind


def test_the_sums_weigh_each_shape_by_how_often_the_model_has_it(bench):
    a, b = bench.Conv(2, 6, 6, 3, 3, 3, 4, 1, "SAME"), bench.Conv(1, 5, 7, 4, 1, 1, 6, 1, "VALID")
    r = bench.measure(collections.Counter({a: 3, b: 1}), tf.float32, rounds=1)
    assert r["convolutions"] == 4 and [row["count"] for row in r["shapes"]] == [3, 1]  # the most FLOP first
    for kind, t in r["kinds"].items():
        assert t["gflop"] == pytest.approx(3 * bench.gflop(a) + bench.gflop(b))
        assert t["conv_s"] == pytest.approx(sum(row["count"] * row[kind]["conv_s"] for row in r["shapes"]))
        assert t["matmul_s"] == pytest.approx(sum(row["count"] * row[kind]["matmul_s"] for row in r["shapes"]))
        assert t["conv_vs_matmul"] == pytest.approx(t["matmul_s"] / t["conv_s"])
    assert r["conv_s"] == pytest.approx(sum(t["conv_s"] for t in r["kinds"].values()))
