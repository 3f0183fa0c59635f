"""Issue 23's operators: models exported by real PyTorch (scripts/onnx_fixture_models.py) checked
against onnxruntime and PyTorch's gradients, and hand-made ONNX graphs for what PyTorch does not
export (reverse-only recurrences, ``layout=1``, resize modes, ``If``, ``Loop``)."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from tests.tfnet.onnx_fixtures import check_backward, check_forward, path_of, rel, run_ort  # noqa: E402
from tfnet import TFNet  # noqa: E402
from tfnet.onnx import OnnxConversionError, UnsupportedOperatorError  # noqa: E402

# name -> operators it exercises
FIXTURE_OPS = {
    "gru_text": "GRU bidirectional, two layers, no initial state",
    "lstm_text": "LSTM bidirectional, two layers",
    "rnn_state": "RNN tanh bidirectional two layers; GRU and RNN (ReLU) from an initial state",
    "tcn": "Conv 1-D (dilated, grouped, strided), Pad constant, BatchNorm1d, GroupNorm, MaxPool/AveragePool 1-D",
    "unet": "Pad reflect/edge/constant, InstanceNormalization, ConvTranspose (groups, output padding), Resize",
    "tensor_ops": "Einsum, ReduceL2, ReduceLogSumExp, CumSum, Where, Expand, Tile, TopK, Conv/pools 3-D, Resize",
}
_NETS = {}


def net_of(name):
    if name not in _NETS:
        _NETS[name] = TFNet.from_onnx(path_of(name))
    return _NETS[name]


@pytest.mark.parametrize("name", sorted(FIXTURE_OPS))
def test_pytorch_exports_forward_and_gradients(name):
    net = net_of(name)
    check_forward(net, name)
    check_backward(net, name)


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _info(name, shape, dtype=TensorProto.FLOAT):
    """A value's type; an int shape is a rank of unknown dimensions."""
    if isinstance(shape, int):
        shape = [f"{name}{i}" for i in range(shape)]
    return helper.make_tensor_value_info(name, dtype, shape)


def _tensor(name, value):
    return onnx.numpy_helper.from_array(np.asarray(value, np.float32), name)


def _recurrent_model(op, direction, layout, rng):
    dirs, hidden, feat, gates = (2 if direction == "bidirectional" else 1), 3, 4, {"GRU": 3, "RNN": 1, "LSTM": 4}[op]
    inits = [_tensor("W", rng.standard_normal((dirs, gates * hidden, feat)) * 0.5),
             _tensor("R", rng.standard_normal((dirs, gates * hidden, hidden)) * 0.5),
             _tensor("B", rng.standard_normal((dirs, 2 * gates * hidden)) * 0.5)]
    state = (2, dirs, hidden) if layout else (dirs, 2, hidden)  # initial states as weights (batch 2)
    inits += [_tensor(n, rng.standard_normal(state)) for n in (["h0", "c0"] if op == "LSTM" else ["h0"])]
    names = ["x", "W", "R", "B", "", "h0"] + (["c0"] if op == "LSTM" else [])
    node = helper.make_node(op, names, ["y", "y_h"], hidden_size=hidden, direction=direction, layout=layout)
    x = _info("x", ["batch", 5, feat] if layout else [5, "batch", feat])
    return _model([node], [x], [_info("y", 4), _info("y_h", 3)], inits, opset=14)


@pytest.mark.parametrize("op,direction,layout", [
    ("GRU", "reverse", 0), ("GRU", "bidirectional", 1), ("RNN", "reverse", 1), ("RNN", "bidirectional", 0),
    ("LSTM", "bidirectional", 1),
])
def test_recurrences_pytorch_does_not_export(op, direction, layout):
    """Reverse-only directions, batch-major ``layout=1`` (onnxruntime runs only ``layout=0``: its
    reference is the same model in ``layout=0`` on transposed data), GRU with ``linear_before_reset=0``."""
    model = _recurrent_model(op, direction, layout, np.random.default_rng(0))
    reference = _recurrent_model(op, direction, 0, np.random.default_rng(0))
    if layout:  # the same states, moved to layout 0
        for t in reference.graph.initializer:
            if t.name in ("h0", "c0"):
                value = onnx.numpy_helper.to_array([i for i in model.graph.initializer if i.name == t.name][0])
                t.CopyFrom(onnx.numpy_helper.from_array(value.transpose(1, 0, 2), t.name))
    x = np.random.default_rng(1).standard_normal((5, 2, 4)).astype(np.float32)  # (seq, batch, features)
    y, y_h = run_ort(reference, [x])
    if layout:
        x, y, y_h = x.transpose(1, 0, 2), y.transpose(2, 0, 1, 3), y_h.transpose(1, 0, 2)
    got = TFNet.from_onnx(model, relax_batch=False).forward(x)
    assert rel(got[0], y) < 1e-5 and rel(got[1], y_h) < 1e-5


@pytest.mark.parametrize("mode,coord,nearest", [
    ("nearest", "asymmetric", "floor"), ("nearest", "half_pixel", "round_prefer_floor"),
    ("nearest", "tf_half_pixel_for_nn", "ceil"), ("nearest", "align_corners", "round_prefer_ceil"),
    ("linear", "pytorch_half_pixel", "floor"), ("linear", "half_pixel", "floor"), ("linear", "align_corners", "floor"),
    ("linear", "asymmetric", "floor"), ("cubic", "pytorch_half_pixel", "floor"), ("cubic", "align_corners", "floor"),
    ("cubic", "half_pixel", "exclude_outside"),
])
def test_resize_modes_equal_onnxruntime(mode, coord, nearest):
    x = np.random.default_rng(1).standard_normal((2, 3, 5, 4)).astype(np.float32)
    scales = onnx.numpy_helper.from_array(np.array([1, 1, 1.6, 0.75], np.float32), "scales")
    extra = {"exclude_outside": 1, "cubic_coeff_a": -0.5} if nearest == "exclude_outside" else {"nearest_mode": nearest}
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode, coordinate_transformation_mode=coord,
                            **extra)
    model = _model([node], [_info("x", [None, 3, 5, 4])], [_info("y", 4)], [scales])
    got = TFNet.from_onnx(model).forward(x)
    want = run_ort(model, [x])[0]
    assert got.shape == want.shape == (2, 3, 8, 3) and rel(got, want) < 1e-6


@pytest.mark.parametrize("mode", ["edge", "reflect", "constant"])
def test_pad_axes_and_negative_pads_equal_onnxruntime(mode):
    """Opset 18's ``axes`` input, a negative pad (a crop), a constant value."""
    x = np.random.default_rng(2).standard_normal((2, 4, 5, 3)).astype(np.float32)
    pads = onnx.numpy_helper.from_array(np.array([2, -1, 1, 1], np.int64), "pads")
    axes = onnx.numpy_helper.from_array(np.array([2, -1], np.int64), "axes")
    value = onnx.numpy_helper.from_array(np.array(0.5, np.float32), "value")
    nodes = [helper.make_node("Pad", ["x", "pads", "value", "axes"], ["y"], mode=mode)]
    model = _model(nodes, [_info("x", [None, 4, 5, 3])], [_info("y", 4)], [pads, axes, value], opset=18)
    got = TFNet.from_onnx(model).forward(x)
    want = run_ort(model, [x])[0]
    assert got.shape == want.shape == (2, 4, 8, 3) and rel(got, want) < 1e-6


def _if_model(cond_node):
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [_info("t", 2)])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [_info("e", 2)])
    nodes = [cond_node, helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    return _model(nodes, [_info("x", [None, 3])], [_info("y", 2)])


def test_if_with_a_constant_condition_is_folded_and_a_data_dependent_one_is_a_tf_cond():
    x = np.array([[-1.0, 2.0, -3.0]], np.float32)
    for flag, want in ((True, [[0, 2, 0]]), (False, [[1, -2, 3]])):
        model = _if_model(helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", TensorProto.BOOL, [], [flag])))
        net = TFNet.from_onnx(model)
        assert net.forward(x).tolist() == want == run_ort(model, [x])[0].tolist()
    model = _if_model(helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0))
    model.graph.node.insert(1, helper.make_node("Cast", ["m"], ["c"], to=TensorProto.BOOL))
    net = TFNet.from_onnx(model)
    for x in (np.array([[-1.0, 2.0, -3.0]], np.float32), np.array([[0.0, 0.0, 0.0]], np.float32)):
        assert net.forward(x).tolist() == run_ort(model, [x])[0].tolist()


def _loop_model(opset=17, trip_count="n", cond=""):
    """``y = x + x + ... (n times)``, with the running sums as a scan output."""
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "x"], ["acc_out"]), helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", ["acc_out"], ["scan"])],
        "body", [_info("i", [], TensorProto.INT64), _info("cond_in", [], TensorProto.BOOL), _info("acc_in", 2)],
        [_info("cond_out", [], TensorProto.BOOL), _info("acc_out", 2), _info("scan", 2)])
    nodes = [helper.make_node("Loop", [trip_count, cond, "x"], ["y", "sums"], body=body)]
    return _model(nodes, [_info("x", [None, 3]), _info("n", [], TensorProto.INT64)], [_info("y", 2), _info("sums", 3)],
                  opset=opset)


def test_a_loop_with_a_run_time_trip_count_converts_and_an_endless_or_old_one_is_refused():
    x = np.array([[1.0, -2.0, 0.5], [3.0, 0.0, -1.0]], np.float32)
    model = _loop_model()
    net = TFNet.from_onnx(model, relax_batch=False)
    for n in (1, 4):
        got = net.forward([x, np.array(n, np.int64)])
        want = run_ort(model, [x, np.array(n, np.int64)])
        assert got[0].tolist() == want[0].tolist() == ((n + 1) * x).tolist()
        assert got[1].shape == want[1].shape == (n, 2, 3) and got[1].tolist() == want[1].tolist()
    with pytest.raises(OnnxConversionError, match=r"Loop '.*' has neither a trip count nor a condition: it never "
                                                  r"ends\."):
        TFNet.from_onnx(_loop_model(trip_count=""), relax_batch=False)
    with pytest.raises(UnsupportedOperatorError, match=r"Loop v1 \(x1\) \(vN: .*\)\. Loop: tfnet converts Loop from "
                                                       r"version 11"):
        TFNet.from_onnx(_loop_model(opset=10), relax_batch=False)


@pytest.mark.parametrize("rank,attrs", [
    (1, {"strides": [2], "pads": [1, 0], "output_padding": [1], "group": 2}),
    (2, {"strides": [2, 3], "output_shape": [9, 10]}),
    (2, {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    (2, {"strides": [1, 2], "auto_pad": "VALID", "group": 2}),
    (3, {"strides": [2, 1, 2], "pads": [1, 0, 0, 0, 1, 1], "output_padding": [1, 0, 0], "group": 2}),
    (2, {"strides": [2, 1], "dilations": [2, 3], "pads": [1, 0, 0, 2]}),
])
def test_conv_transpose_variants_equal_onnxruntime(rank, attrs):
    rng = np.random.default_rng(4)
    spatial = {1: [5], 2: [4, 3], 3: [3, 4, 3]}[rank]
    w = _tensor("w", rng.standard_normal([4, 3 if attrs.get("group", 1) == 2 else 6, *([3] * rank)]) * 0.3)
    b = _tensor("b", rng.standard_normal([6]) * 0.3)  # 6 output channels either way
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)
    model = _model([node], [_info("x", [None, 4, *spatial])], [_info("y", rank + 2)], [w, b])
    x = rng.standard_normal([2, 4, *spatial]).astype(np.float32)
    got, want = TFNet.from_onnx(model).forward(x), run_ort(model, [x])[0]
    assert got.shape == want.shape and rel(got, want) < 1e-5


def test_a_sequence_first_input_names_relax_batch():
    """A recurrent op fed straight from a graph input of shape (seq, batch, features): relaxing
    dimension 0 (the default) makes the sequence length dynamic, and the error says what to pass."""
    model = _recurrent_model("GRU", "forward", 0, np.random.default_rng(5))
    with pytest.raises(OnnxConversionError, match=r"GRU .* dynamic sequence length .*pass relax_batch=False"):
        TFNet.from_onnx(model)
    assert TFNet.from_onnx(model, relax_batch=False).input_specs[0].shape.as_list() == [5, None, 4]


def _refused(op, inputs, attrs, shapes, inits=(), opset=17):
    node = helper.make_node(op, [i for i, _ in inputs], ["y"], **attrs)
    infos = [_info(name, shape) for name, shape in inputs if name and name not in {t.name for t in inits}]
    return _model([node], infos, [_info("y", shapes)], list(inits), opset=opset)


@pytest.mark.parametrize("model,message", [
    (lambda: _model([helper.make_node("Resize", ["x", "", "", "s"], ["y"], mode="linear", antialias=1)],
                    [_info("x", [None, 2, 4, 4]), _info("s", [4], TensorProto.INT64)], [_info("y", 4)], opset=18),
     r"Resize '.*': its sizes are known only at run time, where tfnet resizes with nearest, linear and cubic modes "
     r"and the coordinate transformations .*; this one has antialias"),
    (lambda: _refused("RNN", [("x", [4, None, 3]), ("W", None), ("R", None)], {"hidden_size": 2, "clip": 1.0}, 4,
                      [_tensor("W", np.ones((1, 2, 3))), _tensor("R", np.ones((1, 2, 2)))]),
     r"RNN '.*': clip and input_forget are not supported"),
    (lambda: _refused("GRU", [("x", [4, None, 3]), ("W", None), ("R", None)],
                      {"hidden_size": 2, "activations": ["HardSigmoid", "Tanh"]}, 4,
                      [_tensor("W", np.ones((1, 6, 3))), _tensor("R", np.ones((1, 6, 2)))]),
     r"GRU '.*': activations \['HardSigmoid'\] with alpha/beta are not supported \(supported: Relu, Sigmoid, Tanh\)"),
])
def test_what_does_not_convert_is_refused_by_name(model, message):
    with pytest.raises(OnnxConversionError, match=message):
        TFNet.from_onnx(model(), relax_batch=False)


# ------------------------------------------------------------------ issue 32's operators against onnxruntime

@pytest.mark.parametrize("op,attrs,spatial", [
    ("Conv", {"dilations": [2, 2, 2], "pads": [1, 0, 1, 1, 2, 0]}, [7, 8, 6]),
    ("Conv", {"dilations": [2, 1, 3], "strides": [2, 1, 2], "group": 2}, [7, 5, 9]),
    ("MaxPool", {"kernel_shape": [3, 2], "dilations": [2, 3], "strides": [2, 3], "pads": [1, 1, 0, 1]}, [11, 13]),
    ("MaxPool", {"kernel_shape": [3, 3], "dilations": [2, 2], "strides": [3, 1], "ceil_mode": 1}, [12, 10]),
    ("AveragePool", {"kernel_shape": [2, 3], "dilations": [3, 2], "strides": [3, 2], "pads": [1, 1, 1, 0]},
     [10, 9]),
    ("AveragePool", {"kernel_shape": [3], "dilations": [2], "strides": [2], "pads": [1, 2],
                     "count_include_pad": 1, "ceil_mode": 1}, [12]),
    ("MaxPool", {"kernel_shape": [2, 2, 2], "dilations": [2, 1, 2], "strides": [2, 1, 2]}, [7, 6, 5]),
])
def test_dilated_convolutions_and_pools_equal_onnx_reference(op, attrs, spatial):
    """Dilated 3-D convolutions (space-to-batch) and dilated pools (strided views where the stride is a
    multiple of the dilation, space-to-batch otherwise; ceil_mode, pads, count_include_pad), against onnx's
    reference evaluator."""
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(54)
    inits = []
    inputs = ["x"]
    if op == "Conv":
        inits = [_tensor("w", rng.standard_normal([4, 4 // attrs.get("group", 1), 2, 3, 2]) * 0.3)]
        inputs = ["x", "w"]
    node = helper.make_node(op, inputs, ["y"], **attrs)
    model = _model([node], [_info("x", [2, 4, *spatial])], [_info("y", len(spatial) + 2)], inits, opset=19)
    x = rng.standard_normal([2, 4, *spatial]).astype(np.float32)
    got, want = TFNet.from_onnx(model).forward(x), ReferenceEvaluator(model).run(None, {"x": x})[0]
    assert got.shape == want.shape and rel(got, want) < 1e-5


def _run_both(model, inputs):
    net = TFNet.from_onnx(model, relax_batch=False)
    return net.forward(inputs if len(inputs) > 1 else inputs[0]), run_ort(model, inputs)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_equals_onnxruntime(reduction):
    """Rows and single elements, repeated indices (combined by the reduction), negative indices; the
    updates are a weight and get gradients."""
    rng = np.random.default_rng(32)
    data = rng.standard_normal((4, 3, 5)).astype(np.float32)
    rows = np.array([[[1], [-1]], [[0], [1]]], np.int64)  # (2, 2, 1): rows 1, 3, 0, 1 (row 1 twice)
    updates = rng.standard_normal((2, 2, 3, 5))
    attrs = {} if reduction == "none" else {"reduction": reduction}
    if reduction == "none":  # repeated indices have no defined result without a reduction
        rows = np.array([[[1], [-1]], [[0], [2]]], np.int64)
    node = helper.make_node("ScatterND", ["x", "i", "u"], ["y"], **attrs)
    model = _model([node], [_info("x", [4, 3, 5])], [_info("y", [4, 3, 5])],
                   [onnx.numpy_helper.from_array(rows, "i"), _tensor("u", updates)], opset=18)
    got, want = _run_both(model, [data])
    assert rel(got, want[0]) < 1e-6
    cells = np.array([[0, 2, 4], [3, 1, 0], [3, 1, 0]], np.int64)  # whole index tuples, one repeated
    node = helper.make_node("ScatterND", ["x", "c", "v"], ["y"], **attrs)
    if reduction == "none":
        cells = cells[:2]
    model = _model([node], [_info("x", [4, 3, 5])], [_info("y", [4, 3, 5])],
                   [onnx.numpy_helper.from_array(cells, "c"), _tensor("v", rng.standard_normal(len(cells)))], opset=18)
    got, want = _run_both(model, [data])
    assert rel(got, want[0]) < 1e-6
    _, grads = TFNet.from_onnx(model, relax_batch=False).backward(data)
    if reduction in ("none", "add"):  # the written cells' output gradient (ones), summed over repeats
        np.testing.assert_array_equal(grads["v"], np.ones(len(cells), np.float32))


@pytest.mark.parametrize("upper,k", [(1, 0), (1, 1), (0, 0), (0, -1), (1, -2), (0, 3)])
def test_trilu_equals_onnxruntime(upper, k):
    rng = np.random.default_rng(33)
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    node = helper.make_node("Trilu", ["x", "k"], ["y"], upper=upper)
    model = _model([node], [_info("x", [None, 3, 4, 5])], [_info("y", 4)],
                   [onnx.numpy_helper.from_array(np.array(k, np.int64), "k")], opset=14)
    got, want = _run_both(model, [x])
    np.testing.assert_array_equal(got, want[0])
    assert (got == 0).any() and (got == x).any()


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_equals_onnxruntime(mode):
    """Also after a convolution, whose output tfnet holds in NHWC (DCR runs there as TensorFlow's
    depth_to_space)."""
    rng = np.random.default_rng(34)
    x = rng.standard_normal((2, 8, 3, 4)).astype(np.float32)
    w = _tensor("w", rng.standard_normal((8, 8, 1, 1)) * 0.5)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("DepthToSpace", ["c"], ["y"], blocksize=2,
                                                                           mode=mode),
             helper.make_node("DepthToSpace", ["x"], ["z"], blocksize=2, mode=mode)]
    model = _model(nodes, [_info("x", [None, 8, 3, 4])], [_info("y", 4), _info("z", 4)], [w], opset=13)
    got, want = _run_both(model, [x])
    assert got[0].shape == want[0].shape == (2, 2, 6, 8)
    assert rel(got[0], want[0]) < 1e-5
    np.testing.assert_array_equal(got[1], want[1])


def test_space_to_depth_equals_onnxruntime():
    rng = np.random.default_rng(35)
    x = rng.standard_normal((2, 3, 6, 4)).astype(np.float32)
    w = _tensor("w", rng.standard_normal((3, 3, 1, 1)) * 0.5)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("SpaceToDepth", ["c"], ["y"], blocksize=2),
             helper.make_node("SpaceToDepth", ["x"], ["z"], blocksize=2)]
    model = _model(nodes, [_info("x", [None, 3, 6, 4])], [_info("y", 4), _info("z", 4)], [w], opset=13)
    got, want = _run_both(model, [x])
    assert got[0].shape == want[0].shape == (2, 12, 3, 2)
    assert rel(got[0], want[0]) < 1e-5
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("maxsplit", [None, 0, 1, 2, 5])
@pytest.mark.parametrize("delimiter", [None, " ", "ab"])
def test_string_split_equals_onnx_reference(maxsplit, delimiter):
    """``StringSplit`` as Python's ``str.split`` (onnx's reference): on whitespace, TensorFlow's split adds an
    empty part where maxsplit is more than a string's splits ("hello world" with 2) and keeps leading whitespace with
    maxsplit 0; Python's makes neither. Random strings of letters, spaces, tabs and newlines."""
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(57)
    texts = np.array(["".join(rng.choice(list("ab \t\n"), size=rng.integers(0, 10))) for _ in range(240)]
                     + ["hello world", "x", " ", ""], dtype=object).reshape(61, 4)
    attrs = {k: v for k, v in (("delimiter", delimiter), ("maxsplit", maxsplit)) if v is not None}
    node = helper.make_node("StringSplit", ["x"], ["parts", "counts"], **attrs)
    model = _model([node], [_info("x", [61, 4], TensorProto.STRING)],
                   [_info("parts", 3, TensorProto.STRING), _info("counts", 2, TensorProto.INT64)], opset=20)
    parts, counts = TFNet.from_onnx(model, relax_batch=False).forward(texts)
    want_parts, want_counts = ReferenceEvaluator(model).run(None, {"x": texts})
    np.testing.assert_array_equal(counts, want_counts)
    assert parts.tolist() == np.char.encode(want_parts.astype(str)).tolist()


@pytest.mark.parametrize("opset,attrs", [
    (16, {"sampling_ratio": 2}),  # half_pixel by default
    (16, {"sampling_ratio": 0, "output_height": 3, "output_width": 2}),  # adaptive: a grid per region
    (16, {"sampling_ratio": 0, "mode": "max", "coordinate_transformation_mode": "output_half_pixel"}),
    (10, {"sampling_ratio": 3, "spatial_scale": 0.5, "mode": "max"}),  # version 10: output_half_pixel only
    (22, {"sampling_ratio": 1, "output_height": 4, "output_width": 4, "spatial_scale": 0.5}),
    (19, {"sampling_ratio": 2, "output_height": 4, "output_width": 4, "spatial_scale": 0.5}),  # version 16
])
def test_roi_align_equals_onnxruntime_and_onnx_reference_and_its_input_gradient_its_linear_map(opset, attrs):
    """``RoiAlign`` (torchvision's ``roi_align`` exports to it) against onnxruntime and, from version 16, onnx's
    reference (which gives version 10, whose regions are never shifted by half a pixel, version 16's half_pixel
    default: 1.76 away from onnxruntime on these regions): two images, regions inside, across the border, past it,
    of zero and negative size, on either image. The input's gradient of the average (linear in the input) against
    the oracle's own map, read column by column; of the maximum (the largest weighted tap's weight), the oracle's slopes,
    wherever a step either side gives the same."""
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(58)
    x = rng.standard_normal((2, 3, 7, 9)).astype(np.float32)
    rois = np.array([[1, 1, 5, 4], [0.5, 2.2, 8.9, 6.7], [-3, -2, 4, 3], [6, 4, 15, 11], [2, 3, 2, 3],
                     [5, 5, 3, 2], [0, 0, 9, 7]], np.float32) * (2 if attrs.get("spatial_scale") else 1)
    batch = np.array([0, 1, 1, 0, 1, 0, 1], np.int64)
    attrs = {"output_height": 2, "output_width": 3, **attrs}
    node = helper.make_node("RoiAlign", ["x", "rois", "batch"], ["y"], **attrs)
    inits = [_tensor("rois", rois), onnx.numpy_helper.from_array(batch, "batch")]
    model = _model([node], [_info("x", [2, 3, 7, 9])], [_info("y", 4)], inits, opset=opset)
    import onnxruntime as ort

    # onnxruntime has no version 22 (its float16 and bfloat16 types); onnx's reference, every version but 10
    oracles = ([ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])] if opset < 22
               else []) + ([ReferenceEvaluator(model)] if opset >= 16 else [])
    net = TFNet.from_onnx(model, relax_batch=False)
    got = net.forward(x)
    for oracle in oracles:
        want = oracle.run(None, {"x": x})[0]
        assert got.shape == want.shape == (7, 3, attrs["output_height"], attrs["output_width"])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    g_out = rng.standard_normal(got.shape).astype(np.float32)
    grad = net.backward(x, g_out)[0]
    oracle = oracles[0]
    if attrs.get("mode") == "max":  # piecewise linear: the oracle's slopes where both sides of a step agree
        h, base = 1e-2, oracle.run(None, {"x": x})[0].ravel() @ g_out.ravel()
        steps = np.eye(x.size, dtype=np.float32).reshape(x.size, *x.shape) * h
        ahead = np.array([(oracle.run(None, {"x": x + d})[0].ravel() @ g_out.ravel() - base) / h for d in steps])
        behind = np.array([(base - oracle.run(None, {"x": x - d})[0].ravel() @ g_out.ravel()) / h for d in steps])
        linear = np.abs(ahead - behind) < 1e-3  # no maximum moves to another tap within the step
        assert linear.mean() > 0.9 and np.abs(ahead[linear]).sum() > 1
        np.testing.assert_allclose(grad.ravel()[linear], ahead[linear], rtol=1e-3, atol=1e-3)
        return
    columns = np.eye(x.size, dtype=np.float32).reshape(x.size, *x.shape)  # the map, one unit input at a time
    linear = np.stack([oracle.run(None, {"x": c})[0].ravel() for c in columns], 1)
    np.testing.assert_allclose(grad.ravel(), linear.T.astype(np.float64) @ g_out.ravel(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("image,block,attrs", [
    ([5, 6], [2, 3], {}),
    ([7, 8], [3, 3], {"strides": [2, 3], "pads": [1, 0, 2, 1]}),
    ([9, 7], [2, 2], {"dilations": [3, 2], "strides": [1, 2], "pads": [0, 1, 1, 0]}),
    ([4, 5, 6], [2, 2, 3], {"strides": [2, 1, 3], "pads": [1, 0, 0, 0, 1, 0]}),  # volumetric
])
def test_col2im_equals_onnx_reference_and_its_gradient_is_its_adjoint(image, block, attrs):
    """``Col2Im`` (PyTorch's ``nn.Fold``): blocks summed back into the image with strides, dilations and pads (the
    padded border dropped), 2-D and 3-D, against onnx's reference; it is linear, so its input gradient is the
    transpose of the reference's map: the same inner product with any probe taken through either."""
    from onnx.reference import ReferenceEvaluator

    from tfnet.onnx.ops_col2im import pixel_map

    n = len(image)
    where = pixel_map(image, block, attrs.get("strides", [1] * n), attrs.get("dilations", [1] * n),
                      attrs.get("pads", [0] * 2 * n))
    k, blocks = where.shape
    shape = [2, 3 * k, blocks]
    consts = [onnx.numpy_helper.from_array(np.array(image, np.int64), "image"),
              onnx.numpy_helper.from_array(np.array(block, np.int64), "block")]
    node = helper.make_node("Col2Im", ["x", "image", "block"], ["y"], **attrs)
    model = _model([node], [_info("x", shape)], [_info("y", n + 2)], consts, opset=18)
    x = np.random.default_rng(59).standard_normal(shape).astype(np.float32)
    reference = ReferenceEvaluator(model)
    net = TFNet.from_onnx(model, relax_batch=False)
    got = net.forward(x)
    np.testing.assert_allclose(got, reference.run(None, {"x": x})[0], rtol=1e-6, atol=1e-6)
    assert got.shape == (2, 3, *image)
    rng = np.random.default_rng(60)
    g_out = rng.standard_normal(got.shape).astype(np.float32)
    grad = net.backward(x, g_out)[0].astype(np.float64)
    for probe in rng.standard_normal((4, *x.shape)).astype(np.float32):  # <A v, g> = <v, A^T g> for any v
        folded = reference.run(None, {"x": probe})[0].astype(np.float64)
        assert abs(np.vdot(folded, g_out) - np.vdot(probe, grad)) < 1e-5 * np.linalg.norm(folded) * np.linalg.norm(g_out)


@pytest.mark.parametrize("pool,size,given", [
    ({"kernel_shape": [2, 2], "strides": [2, 2]}, [8, 10], False),  # SegNet's
    ({"kernel_shape": [2, 2], "strides": [2, 2]}, [9, 7], True),  # odd sizes: output_shape says which
    ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, [9, 10], True),  # overlapping windows
    ({"kernel_shape": [2], "strides": [2]}, [11], True),
    ({"kernel_shape": [2, 2, 2], "strides": [2, 2, 2]}, [4, 6, 4], False),
])
def test_max_pool_then_unpool_puts_each_maximum_back_as_onnxruntime_does(pool, size, given):
    """``MaxPool``'s values and ``Indices`` into ``MaxUnpool`` (the pool's input shape as ``output_shape`` or
    inferred; 1-D to 3-D): each window's maximum back in its place, zeros elsewhere (numpy), as onnxruntime gives it
    (2-D); the input gradient is the outgoing gradient at the maxima, once for a maximum two overlapping windows
    share."""
    n = len(pool["kernel_shape"])
    shape = [2, 3, *size]
    nodes = [helper.make_node("MaxPool", ["x"], ["p", "i"], **pool), helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("MaxUnpool", ["p", "i"] + (["s"] if given else []), ["y"], **pool)]
    model = _model(nodes, [_info("x", shape)], [_info("y", n + 2)], opset=22)
    x = np.random.default_rng(61).standard_normal(shape).astype(np.float32)
    net = TFNet.from_onnx(model, relax_batch=False)
    got = net.forward(x)
    _, indices = net_of_pool(pool, shape).forward(x)
    want = np.zeros(got.size, np.float32)
    want[np.unique(indices.ravel())] = x.ravel()[np.unique(indices.ravel())]  # each maximum in its own place
    np.testing.assert_array_equal(got.ravel(), want)
    assert got.shape == tuple(shape) or not given
    if n == 2 and (given or size[0] % 2 == 0):
        np.testing.assert_array_equal(got, run_ort(model, [x])[0])
    g_out = np.random.default_rng(62).standard_normal(got.shape).astype(np.float32)
    maxima = np.zeros(got.size, bool)
    maxima[indices.ravel()] = True
    np.testing.assert_array_equal(net.backward(x, g_out)[0].ravel(), np.where(maxima, g_out.ravel(), 0))


def net_of_pool(pool, shape):
    """``MaxPool`` alone, its values and ``Indices`` (onnxruntime checks those elsewhere)."""
    node = helper.make_node("MaxPool", ["x"], ["p", "i"], **pool)
    model = _model([node], [_info("x", shape)], [_info("p", len(shape)), _info("i", len(shape), TensorProto.INT64)],
                   opset=22)
    return TFNet.from_onnx(model, relax_batch=False)


@pytest.mark.parametrize("attrs", [
    {"mode": "linear"},  # half_pixel
    {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
    {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
    {"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1},
    {"mode": "cubic", "coordinate_transformation_mode": "align_corners"},
])
def test_resize_to_sizes_known_at_run_time_equals_the_converted_one_and_onnxruntime(attrs):
    """``Resize`` where the spatial sizes are known only at run time (tfnet.onnx.resize_run_time): an input of any
    height and width scaled by constants, and one resized to another input's height and width (``sizes`` from its
    ``Shape``, as torchvision's Mask R-CNN pastes masks); values and input gradients equal to the same model with
    fixed sizes (converted with taps computed while converting, checked against onnxruntime and PyTorch elsewhere), and
    values to onnxruntime's."""
    rng = np.random.default_rng(63)
    x = rng.standard_normal((2, 3, 5, 8)).astype(np.float32)  # scaled to 8 x 6 (whole: align_corners reads the
    like = np.zeros((2, 1, 9, 4), np.float32)  # unrounded length in onnx's reference, the rounded one in onnxruntime)
    scales = _tensor("scales", [1, 1, 1.6, 0.75])

    def models(h, w, lh, lw):
        by_scale = _model([helper.make_node("Resize", ["x", "", "scales"], ["y"], **attrs)],
                          [_info("x", [2, 3, h, w])], [_info("y", 4)], [scales], opset=19)
        shape = [helper.make_node("Shape", ["like"], ["s"]),
                 helper.make_node("Shape", ["x"], ["xs"], end=2), helper.make_node("Shape", ["like"], ["ls"], start=2),
                 helper.make_node("Concat", ["xs", "ls"], ["sizes"], axis=0),
                 helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], **attrs)]
        by_size = _model(shape, [_info("x", [2, 3, h, w]), _info("like", [2, 1, lh, lw])], [_info("y", 4)], opset=19)
        return by_scale, by_size

    run_time, fixed = models("h", "w", "lh", "lw"), models(5, 8, 9, 4)
    for k, inputs in enumerate(([x], [x, like])):
        dynamic = TFNet.from_onnx(run_time[k], relax_batch=False)
        static = TFNet.from_onnx(fixed[k], relax_batch=False)
        got = dynamic.forward(inputs if k else x)
        np.testing.assert_allclose(got, static.forward(inputs if k else x), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got, run_ort(run_time[k], inputs)[0], rtol=1e-5, atol=1e-5)
        g = rng.standard_normal(got.shape).astype(np.float32)
        grad = dynamic.backward(inputs if k else x, g)[0]
        np.testing.assert_allclose(grad[0] if k else grad, static.backward(inputs if k else x, g)[0][0] if k
                                   else static.backward(x, g)[0], rtol=1e-5, atol=1e-5)
    assert got.shape == (2, 3, 9, 4)


@pytest.mark.parametrize("attrs,mask,bias,spatial", [
    ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, True, True, "static"),
    ({"kernel_shape": [2, 3], "strides": [2, 1], "pads": [0, 2, 1, 0], "group": 2}, False, True, "run time"),
    ({"kernel_shape": [3, 2], "dilations": [2, 1], "pads": [2, 1, 2, 0], "offset_group": 2}, True, False, "static"),
    ({"kernel_shape": [1, 1], "strides": [2, 2], "group": 2, "offset_group": 4}, True, True, "run time"),
])
def test_deform_conv_equals_onnxruntime_and_onnx_reference(attrs, mask, bias, spatial):
    """``DeformConv`` beyond what torchvision exports (the dyn_deform fixture has PyTorch's gradients): kernels that
    are not square, asymmetric pads, strides and dilations that differ by axis, groups and offset groups, with and
    without a mask and a bias; offsets of up to 3 pixels, so taps fall between pixels and outside the input; spatial
    sizes declared or known only at run time (an export with dynamic height and width)."""
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(59)
    c, out_c, h, w = 4, 6, 7, 8
    kh, kw = attrs["kernel_shape"]
    (sh, sw), (dh, dw) = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    pads = attrs.get("pads", [0, 0, 0, 0])
    oh, ow = (h + pads[0] + pads[2] - dh * (kh - 1) - 1) // sh + 1, (w + pads[1] + pads[3] - dw * (kw - 1) - 1) // sw + 1
    groups, offset_groups = attrs.get("group", 1), attrs.get("offset_group", 1)
    inputs = {"x": rng.standard_normal((2, c, h, w)).astype(np.float32),
              "offset": rng.uniform(-3, 3, (2, offset_groups * kh * kw * 2, oh, ow)).astype(np.float32)}
    inits = [_tensor("W", rng.standard_normal((out_c, c // groups, kh, kw)))]
    optional = (["B" if bias else "", "mask"] if mask else ["B"] if bias else [])  # "": an input left out
    if bias:
        inits.append(_tensor("B", rng.standard_normal(out_c)))
    if mask:
        inputs["mask"] = rng.uniform(0, 1, (2, offset_groups * kh * kw, oh, ow)).astype(np.float32)
    node = helper.make_node("DeformConv", ["x", "W", "offset", *optional], ["y"], **attrs)
    dims = {k: list(v.shape) if spatial == "static" else [*v.shape[:2], f"{k}h", f"{k}w"] for k, v in inputs.items()}
    model = _model([node], [_info(k, dims[k]) for k in inputs], [_info("y", 4)], inits, opset=19)
    import onnxruntime as ort

    got = TFNet.from_onnx(model, relax_batch=False).forward(list(inputs.values()))
    assert got.shape == (2, out_c, oh, ow)
    for oracle in (ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]),
                   ReferenceEvaluator(model)):
        np.testing.assert_allclose(got, oracle.run(None, inputs)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pooled,scale", [([2, 2], 1.0), ([3, 2], 0.5), ([1, 4], 0.25)])
def test_max_roi_pool_equals_onnxruntime(pooled, scale):
    """``MaxRoiPool`` (torchvision's ``roi_pool``; the roi_pool fixture has PyTorch's gradients) against onnxruntime:
    two images, regions inside, across the border, past it (empty bins: 0), smaller than a pixel, reversed, and with
    corners that land on .5 once scaled (rounded away from zero)."""
    rng = np.random.default_rng(60)
    x = rng.standard_normal((2, 3, 9, 11)).astype(np.float32)
    rois = np.array([[0, 1, 1, 6, 5], [1, 0.5, 2.2, 8.9, 6.7], [0, -3, -2, 4, 3], [1, 6, 4, 15, 11], [1, 2, 3, 2, 3],
                     [0, 5, 5, 3, 2], [1, 0, 0, 10, 8], [0, 30, 30, 40, 40], [1, 1.5, 2.5, 5.5, 6.5]], np.float32)
    rois[:, 1:] /= scale
    node = helper.make_node("MaxRoiPool", ["x", "rois"], ["y"], pooled_shape=pooled, spatial_scale=scale)
    model = _model([node], [_info("x", [2, 3, 9, 11])], [_info("y", 4)], [_tensor("rois", rois)])
    import onnxruntime as ort

    got = TFNet.from_onnx(model, relax_batch=False).forward(x)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert got.shape == want.shape == (9, 3, *pooled)
    assert (want[7] == 0).all()  # the region past the map: every bin empty
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("attrs", [
    {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
    {"mode": "cubic", "coordinate_transformation_mode": "pytorch_half_pixel"},
    {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
])
def test_resize_to_one_pixel_at_run_time_reads_where_onnx_says(attrs):
    """A run-time ``Resize`` to a length of 1: ``pytorch_half_pixel`` reads source coordinate -0.5 there (onnx's
    reference), ``align_corners`` 0, as the sizes known while converting do. (The length was compared with ``==``,
    which in the ``tf.Graph`` tfnet converts in compares tensors by identity: always false, so the middle was read.)"""
    rng = np.random.default_rng(64)
    x = rng.standard_normal((1, 2, 6, 7)).astype(np.float32)
    like = np.zeros((1, 1, 1, 3), np.float32)  # height 1, width 3

    def model(h, w, lh, lw):
        shape = [helper.make_node("Shape", ["x"], ["xs"], end=2), helper.make_node("Shape", ["like"], ["ls"], start=2),
                 helper.make_node("Concat", ["xs", "ls"], ["sizes"], axis=0),
                 helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], **attrs)]
        return _model(shape, [_info("x", [1, 2, h, w]), _info("like", [1, 1, lh, lw])], [_info("y", 4)], opset=19)

    got = TFNet.from_onnx(model("h", "w", "lh", "lw"), relax_batch=False).forward([x, like])
    fixed = TFNet.from_onnx(model(6, 7, 1, 3), relax_batch=False).forward([x, like])
    assert got.shape == (1, 2, 1, 3)
    np.testing.assert_allclose(got, fixed, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bins,length,rate,low,high,out_type", [
    (20, 512, 16000, 20.0, 7600.0, TensorProto.FLOAT), (40, 400, 22050, 0.0, 11025.0, TensorProto.DOUBLE),
    (64, 1024, 44100, 125.0, 8000.0, TensorProto.FLOAT16)])
def test_mel_weight_matrix_equals_onnx_reference(bins, length, rate, low, high, out_type):
    """``MelWeightMatrix`` at speech and music settings (the conformance case has one small one), the number of mel
    bins given at run time, against onnx's reference, exactly."""
    from onnx.reference import ReferenceEvaluator

    node = helper.make_node("MelWeightMatrix", ["bins", "length", "rate", "low", "high"], ["w"],
                            output_datatype=out_type)
    consts = [onnx.numpy_helper.from_array(np.array(v, t), n) for n, v, t in
              (("length", length, np.int64), ("rate", rate, np.int64), ("low", low, np.float32),
               ("high", high, np.float32))]
    model = _model([node], [_info("bins", [], TensorProto.INT64)], [_info("w", 2, out_type)], consts)
    got = TFNet.from_onnx(model, relax_batch=False).forward(np.array(bins, np.int64))
    want = ReferenceEvaluator(model).run(None, {"bins": np.array(bins, np.int64)})[0]
    assert got.shape == want.shape == (length // 2 + 1, bins) and got.dtype == want.dtype
    assert (want.sum(0) > 0).all()  # every filter covers a bin
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("pixel_format", ["RGB", "BGR", "Grayscale"])
def test_image_decoder_decodes_what_pillow_encodes_as_pillow_does(pixel_format):
    """``ImageDecoder`` on one image encoded by Pillow as JPEG (4:2:0 and 4:4:4), PNG (with alpha), BMP, GIF, lossy and
    lossless WebP, and a grayscale JPEG, exactly as Pillow decodes it (onnx's reference decodes with Pillow, but hands
    back Pillow's own mode: a GIF's palette indices, a gray image's two axes, RGBA's four channels; the operator's
    definition asks for 3 channels, or 1 for Grayscale, which Pillow's ``convert`` gives); TIFF, which TensorFlow
    cannot decode, fails at run time with a typed error that names the formats it can."""
    import io

    from PIL import Image

    from tfnet import GraphExecutionError

    rng = np.random.default_rng(65)
    yy, xx = np.mgrid[0:37, 0:53]
    smooth = np.stack([yy * 6, xx * 4, (yy + xx) * 3], -1) % 256
    rgb = np.clip(smooth + rng.integers(-20, 20, smooth.shape), 0, 255).astype(np.uint8)

    def encoded(fmt, image=rgb, **kw):
        out = io.BytesIO()
        Image.fromarray(image).save(out, format=fmt, **kw)
        return np.frombuffer(out.getvalue(), np.uint8)

    rgba = np.concatenate([rgb, rng.integers(0, 256, (37, 53, 1)).astype(np.uint8)], -1)
    images = {"jpeg": encoded("JPEG", quality=90), "jpeg 4:4:4": encoded("JPEG", quality=75, subsampling=0),
              "png": encoded("PNG", image=rgba), "bmp": encoded("BMP"), "gif": encoded("GIF"),
              "webp": encoded("WEBP", quality=80), "webp lossless": encoded("WEBP", lossless=True),
              "gray jpeg": encoded("JPEG", image=rgb[..., 1])}
    node = helper.make_node("ImageDecoder", ["encoded"], ["image"], pixel_format=pixel_format)
    model = _model([node], [_info("encoded", ["n"], TensorProto.UINT8)], [_info("image", 3, TensorProto.UINT8)],
                   opset=20)
    net = TFNet.from_onnx(model, relax_batch=False)
    for name, data in images.items():
        image = Image.open(io.BytesIO(data.tobytes()))
        want = (np.array(image.convert("L"))[..., None] if pixel_format == "Grayscale" else
                np.array(image.convert("RGB"))[..., ::-1 if pixel_format == "BGR" else 1])
        got = net.forward(data)
        assert got.dtype == np.uint8 and got.shape == want.shape == (37, 53, 1 if pixel_format == "Grayscale" else 3)
        np.testing.assert_array_equal(got, want, err_msg=name)
    with pytest.raises(GraphExecutionError, match="Unknown image file format. One of JPEG"):
        net.forward(encoded("TIFF"))


@pytest.mark.parametrize("mode,low,high,skips,kind", [
    ("TF", 1, 3, 2, "int"), ("IDF", 2, 2, 0, "int"), ("TFIDF", 1, 2, 3, "string"), ("TF", 2, 3, 1, "string"),
    ("TFIDF", 1, 1, 0, "int"),
])
def test_tfidf_vectorizer_equals_onnxruntime_on_random_pools(mode, low, high, skips, kind):
    """``TfIdfVectorizer`` against onnxruntime: rows of 9 tokens from a vocabulary of 4 and one token outside the pool
    (so n-grams recur, also with gaps), a pool of unigrams, bigrams and trigrams (some sizes outside
    ``min_gram_length`` to ``max_gram_length``, counted by neither), output columns shared by several n-grams and some
    left empty, a weight per n-gram (as ONNX defines and onnxruntime reads them; onnx's reference reads them by output
    column, the same only where the indexes are 0, 1, 2, ...), integer and string tokens, in rows and as one 1-D row."""
    import onnxruntime as ort

    rng = np.random.default_rng(66)
    vocab = np.array(["a", "b", "c", "d"]) if kind == "string" else np.array([3, 7, 11, 20], np.int64)
    x = vocab[rng.integers(0, 4, (5, 9))]
    x[1, 4] = "e" if kind == "string" else 99
    grams = {1: vocab[rng.permutation(4)[:3]].reshape(-1, 1), 2: vocab[rng.integers(0, 4, (6, 2))],
             3: vocab[rng.integers(0, 4, (4, 3))]}
    grams[2] = np.unique(grams[2], axis=0)
    grams[3] = np.unique(grams[3], axis=0)
    pool = np.concatenate([g.ravel() for g in grams.values()])
    counts = np.cumsum([0, len(grams[1]), 2 * len(grams[2])]).tolist()
    total = sum(len(g) for g in grams.values())
    # columns shared by several n-grams and some left empty; where IDF keeps one weight a column (onnxruntime the last
    # n-gram's it meets, tfnet their sum), each n-gram its own column, in another order than the pool's
    indexes = (rng.integers(0, total, total) if mode != "IDF" else rng.permutation(total + 3)[:total]).tolist()
    attrs = dict(mode=mode, min_gram_length=low, max_gram_length=high, max_skip_count=skips, ngram_counts=counts,
                 ngram_indexes=indexes, weights=rng.uniform(0.5, 2, total).astype(np.float32).tolist())
    attrs["pool_strings" if kind == "string" else "pool_int64s"] = pool.tolist()
    node = helper.make_node("TfIdfVectorizer", ["x"], ["y"], **attrs)
    elem = TensorProto.STRING if kind == "string" else TensorProto.INT64
    for data in (x, x[0]):
        model = _model([node], [_info("x", list(data.shape), elem)], [_info("y", data.ndim)], opset=17)
        got = TFNet.from_onnx(model, relax_batch=False).forward(data.astype(object) if kind == "string" else data)
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"x": data})[0]
        assert got.shape == want.shape and np.abs(want).sum() > 0
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_optionals_inside_the_graph_equal_onnxruntime():
    """``Optional`` of a tensor and of a sequence, an empty one, ``OptionalHasElement`` on each (and on no input),
    ``OptionalGetElement`` back to the tensor and the sequence, against onnxruntime; reading an empty optional is
    refused while converting, by name."""
    import onnxruntime as ort

    nodes = [helper.make_node("Optional", ["x"], ["opt_x"]),
             helper.make_node("SplitToSequence", ["x"], ["seq"], axis=1, keepdims=0),
             helper.make_node("Optional", ["seq"], ["opt_seq"]),
             helper.make_node("Optional", [], ["empty"], type=helper.make_tensor_type_proto(TensorProto.FLOAT, [])),
             helper.make_node("OptionalHasElement", ["opt_x"], ["has_x"]),
             helper.make_node("OptionalHasElement", ["empty"], ["has_empty"]),
             helper.make_node("OptionalHasElement", [], ["has_none"]),
             helper.make_node("OptionalGetElement", ["opt_x"], ["got_x"]),
             helper.make_node("OptionalGetElement", ["opt_seq"], ["got_seq"]),
             helper.make_node("ConcatFromSequence", ["got_seq"], ["joined"], axis=0),
             helper.make_node("Cast", ["has_x"], ["one"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["has_empty"], ["zero"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["got_x", "one"], ["y"]),
             helper.make_node("Add", ["joined", "zero"], ["z"])]
    outputs = [_info("y", [2, 3]), _info("z", [6]), _info("has_none", [], TensorProto.BOOL)]
    model = _model(nodes, [_info("x", [2, 3])], outputs, opset=18)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = TFNet.from_onnx(model, relax_batch=False).forward(x)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert want[2] == np.bool_(False) and want[1].tolist() == [0, 3, 1, 4, 2, 5]
    bad = _model([nodes[3], helper.make_node("OptionalGetElement", ["empty"], ["y"])], [_info("x", [2, 3])],
                 [_info("y", [])], opset=18)
    with pytest.raises(OnnxConversionError, match="the optional 'empty' holds nothing"):
        TFNet.from_onnx(bad, relax_batch=False)


def test_scan_8_runs_per_batch_entry_as_onnxruntime_does():
    """``Scan`` version 8 (opset 8: a batch axis on every state and scan input, ``directions``, ``sequence_lens``): a
    running sum and a reversed running product over two scan inputs, for two batch entries, against onnxruntime;
    ``sequence_lens`` of the full length is taken, a shorter one refused by name."""
    import onnxruntime as ort

    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "a"], ["s_out"]), helper.make_node("Mul", ["p_in", "b"], ["p_out"]),
         helper.make_node("Identity", ["s_out"], ["seen_s"]), helper.make_node("Identity", ["p_out"], ["seen_p"])],
        "body", [_info(v, [3]) for v in ("s_in", "p_in", "a", "b")],
        [_info(v, [3]) for v in ("s_out", "p_out", "seen_s", "seen_p")])
    rng = np.random.default_rng(67)
    feeds = {"s0": rng.standard_normal((2, 3)).astype(np.float32), "p0": np.ones((2, 3), np.float32),
             "xa": rng.standard_normal((2, 4, 3)).astype(np.float32),
             "xb": rng.uniform(0.5, 1.5, (2, 4, 3)).astype(np.float32)}

    def model(lens):
        node = helper.make_node("Scan", ["lens" if lens is not None else "", "s0", "p0", "xa", "xb"],
                                ["s", "p", "all_s", "all_p"], body=body, num_scan_inputs=2, directions=[0, 1])
        consts = [onnx.numpy_helper.from_array(np.array(lens, np.int64), "lens")] if lens is not None else []
        return _model([node], [_info(k, list(v.shape)) for k, v in feeds.items()],
                      [_info("s", [2, 3]), _info("p", [2, 3]), _info("all_s", [2, 4, 3]), _info("all_p", [2, 4, 3])],
                      consts, opset=8)

    for lens in (None, [4, 4]):
        got = TFNet.from_onnx(model(lens), relax_batch=False).forward(list(feeds.values()))
        want = ort.InferenceSession(model(lens).SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, feeds)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[0], feeds["s0"] + feeds["xa"].sum(1), rtol=1e-6)
    with pytest.raises(OnnxConversionError, match=r"Scan .*version 8.*sequence_lens absent or all the full length"):
        TFNet.from_onnx(model([4, 2]), relax_batch=False)


@pytest.mark.parametrize("counts,indexes,weights,message", [
    ([0, 2], [0, 1, 2], [], r"ngram_counts \[0, 2\] give the 2-grams 3 pool entries, not a multiple of 2"),
    ([0, 3], [0, 1], [], r"its pool holds 4 n-grams .* ngram_indexes has 2 entries"),
    ([0, 3], [0, 1, 2, 3], [1.0], r"ngram_indexes has 4 entries and weights 1"),
])
def test_a_tfidf_vectorizer_whose_attributes_disagree_is_refused_at_load(counts, indexes, weights, message):
    """A pool that does not cut into its n-grams, or indexes or weights that are not one per n-gram: refused while
    converting, by name, not a numpy or TensorFlow error at run time."""
    attrs = dict(mode="TFIDF" if weights else "TF", min_gram_length=1, max_gram_length=2, max_skip_count=0,
                 ngram_counts=counts, ngram_indexes=indexes, pool_int64s=[1, 2, 3, 4, 5])
    if weights:
        attrs["weights"] = weights
    node = helper.make_node("TfIdfVectorizer", ["x"], ["y"], name="tfidf", **attrs)
    model = _model([node], [_info("x", [2, 4], TensorProto.INT64)], [_info("y", 2)], opset=17)
    with pytest.raises(OnnxConversionError, match=r"TfIdfVectorizer 'tfidf': .*" + message):
        TFNet.from_onnx(model, relax_batch=False)
