"""ONNX models exported by real PyTorch (scripts/export_onnx_fixtures.py) as TFNets, checked against
onnxruntime and against PyTorch's own outputs and gradients stored beside each model."""

import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from tests.tfnet.onnx_fixtures import as_list, path_of, rel, run_ort, stored  # noqa: E402
from tfnet import GraphLoadError, TFNet  # noqa: E402
from tfnet.onnx import (  # noqa: E402
    ExternalDataError,
    OnnxLoadError,
    OpsetError,
    UnsupportedOperatorError,
)

MODELS = ["resnet18", "mobilenet_v2", "transformer", "lstm", "digits_cnn"]


_NETS = {}


def net_of(name):
    if name not in _NETS:
        _NETS[name] = TFNet.from_onnx(path_of(name))
    return _NETS[name]


@pytest.mark.parametrize("name", MODELS)
def test_forward_equals_onnxruntime_and_pytorch(name):
    net, data = net_of(name), stored(name)
    inputs = [data[f"in_{k}"] for k in range(len(net.input_names))]
    outs = as_list(net.forward(inputs))
    for k, (got, want) in enumerate(zip(outs, run_ort(path_of(name), inputs))):
        assert rel(got, want) < 1e-4, (name, k, rel(got, want))
        assert rel(got, data[f"out_{k}"]) < 1e-4, (name, k)
    # dynamic batch: one row more than the stored batch, still equal to onnxruntime
    bigger = [np.concatenate([v, v[:1]]) for v in inputs]
    for got, want in zip(as_list(net.forward(bigger)), run_ort(path_of(name), bigger)):
        assert got.shape[0] == len(inputs[0]) + 1 and rel(got, want) < 1e-4


@pytest.mark.parametrize("name", MODELS)
def test_backward_equals_pytorch_gradients(name):
    net, data = net_of(name), stored(name)
    inputs = [data[f"in_{k}"] for k in range(len(net.input_names))]
    grad_out = [data[f"grad_out_{k}"] for k in range(len(net.output_names))]
    grad_in, grad_w = net.backward(inputs, grad_out)
    for k, g in enumerate(as_list(grad_in)):
        if f"grad_in_{k}" in data:
            assert rel(g, data[f"grad_in_{k}"]) < 1e-3, (name, k)
        else:  # integer input (token ids): no gradient
            assert g is None and not np.issubdtype(inputs[k].dtype, np.floating)
    want = {k[len("grad_w/"):]: v for k, v in data.items() if k.startswith("grad_w/")}
    assert want and set(want) <= set(grad_w), "every PyTorch parameter is a trainable weight, by its ONNX name"
    worst = max(rel(grad_w[n], g) for n, g in want.items())
    assert worst < 1e-3, (name, worst)


def test_weights_named_by_onnx_names_statistics_frozen():
    net = net_of("resnet18")
    model = onnx.load(path_of("resnet18"))
    assert net.weight_names == [t.name for t in model.graph.initializer]
    assert net.statistic_names == [n for n in net.weight_names if n.endswith(("running_mean", "running_var"))]
    assert len(net.statistic_names) == 40
    assert set(net.trainable) == set(net.weight_names) - set(net.statistic_names)
    np.testing.assert_array_equal(net.get_weights(["conv1.weight"])["conv1.weight"],
                                  onnx.numpy_helper.to_array(model.graph.initializer[0]))
    assert TFNet.from_onnx(path_of("resnet18"), trainable="fc.").trainable == ["fc.weight", "fc.bias"]


def test_layout_without_propagation_gives_the_same_function():
    data = stored("mobilenet_v2")
    plain = TFNet.from_onnx(path_of("mobilenet_v2"), propagate_layout=False)
    assert rel(plain.forward(data["in_0"]), data["out_0"]) < 1e-4


def test_save_onnx_round_trip_after_fine_tuning_with_tfoptimizer(tmp_path):
    import optim
    from examples import digits
    from optim import TFOptimizer

    net = TFNet.from_onnx(path_of("digits_cnn"))
    x = stored("digits_cnn")["in_0"]
    before = net.forward(x)
    images, labels = digits.load(range(5, 10))  # new digits, relabelled 0-4: the whole net fine-tunes
    images = images.transpose(0, 3, 1, 2)[:192]
    import tensorflow as tf

    def sce(y, logits):
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(tf.cast(tf.reshape(y, [-1]), tf.int32), logits))

    opt = TFOptimizer(net, sce, optim.Adam(3e-3), metrics=["accuracy"])
    history = opt.optimize((images, labels[:192] - 5), epochs=2, batch_size=32, verbose=0)
    assert history["loss"][-1] < history["loss"][0]
    after = net.forward(x)
    assert rel(after, before) > 1e-3, "the weights changed"
    assert net.get_weights(["features.1.running_mean"])["features.1.running_mean"].tolist() == \
        onnx.numpy_helper.to_array([t for t in onnx.load(path_of("digits_cnn")).graph.initializer
                                    if t.name == "features.1.running_mean"][0]).tolist(), "statistics stay frozen"
    out = str(tmp_path / "tuned.onnx")
    net.save_onnx(out)
    assert rel(run_ort(out, [x])[0], after) < 1e-4
    again = TFNet.from_onnx(out)
    np.testing.assert_allclose(again.forward(x), after, rtol=1e-5, atol=1e-6)
    assert again.statistic_names == net.statistic_names
    # a cut net keeps its ONNX graph behind it (tests/tfnet/test_onnx_export.py covers heads)
    net.cut(net.output_names).save_onnx(str(tmp_path / "x.onnx"))
    assert rel(run_ort(str(tmp_path / "x.onnx"), [x])[0], after) < 1e-5


def test_save_frozen_graph_and_openvino_read_the_same_function(tmp_path):
    import openvino as ov

    net = TFNet.from_onnx(path_of("transformer"))
    data = stored("transformer")
    inputs = [data["in_0"], data["in_1"]]
    net.save(str(tmp_path / "export"))
    loaded = TFNet.load(str(tmp_path / "export"))
    for a, b in zip(loaded.forward(inputs), net.forward(inputs)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    # OpenVINO reads the ONNX file itself, and agrees with tfnet
    compiled = ov.Core().compile_model(ov.convert_model(path_of("digits_cnn")), "CPU",
                                       {"INFERENCE_PRECISION_HINT": "f32"})  # not bf16 on CPUs that have it
    x = stored("digits_cnn")["in_0"]
    assert rel(compiled([x])[0], net_of("digits_cnn").forward(x)) < 1e-4


def test_cut_and_add_head_on_an_onnx_net():
    import keras

    model = onnx.load(path_of("digits_cnn"))
    features = [n for n in model.graph.node if n.op_type == "Gemm"][-1].input[0]
    body = TFNet.from_onnx(path_of("digits_cnn"), outputs=["logits", features])
    feature_name = body.output_names[1]
    keras.utils.set_random_seed(0)
    net = body.cut(feature_name).add_head([keras.layers.Dense(3)], name="head")
    x = stored("digits_cnn")["in_0"]
    assert net.forward(x).shape == (4, 3)
    assert body.forward(x)[1].shape == (4, 64)
    net.trainable = "head/"
    _, grads = net.backward(x)
    assert len(grads) == 2 and all(k.startswith("head/") for k in grads), sorted(grads)
    assert "features.0.weight" in net.weight_names and "features.1.running_mean" in net.statistic_names


def test_several_inputs_by_name_and_integer_ids():
    net = net_of("transformer")
    data = stored("transformer")
    assert net.input_names == ["ids:0", "mask:0"] and net.output_names == ["logits:0", "hidden:0"]
    by_name = net.forward({"mask": data["in_1"], "ids": data["in_0"]})
    np.testing.assert_allclose(by_name[0], data["out_0"], rtol=1e-4, atol=1e-5)
    assert net.input_specs[0].dtype.name == "int64"


# ------------------------------------------------------------------ bad input


def _tiny_model(op="Relu", opset=17, domain=""):
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node(op, ["a"], ["b"], domain=domain),
             helper.make_node(op, ["b"], ["y"], domain=domain)]
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=imports)


def test_corrupt_truncated_and_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"ONNX model file not found: .*nope\.onnx"):
        TFNet.from_onnx(str(tmp_path / "nope.onnx"))
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(os.urandom(2000))
    with pytest.raises(OnnxLoadError, match=r"junk\.onnx.*2000 bytes.*corrupt, truncated, or not ONNX"):
        TFNet.from_onnx(str(junk))
    data = open(path_of("resnet18"), "rb").read()
    cut = tmp_path / "truncated.onnx"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(GraphLoadError, match=r"truncated\.onnx.*(corrupt, truncated|not a valid ONNX model)"):
        TFNet.from_onnx(str(cut))
    with pytest.raises(TypeError, match=r"path to a \.onnx file, its bytes or an onnx\.ModelProto\. Received: int"):
        TFNet.from_onnx(42)


def test_unsupported_operators_are_all_listed_before_anything_runs():
    model = _tiny_model("RandomNormalLike")  # no conversion and no ONNX function for it
    model.graph.node.append(onnx.helper.make_node("FancyOp", ["y"], ["z"], domain="com.example"))
    model.opset_import.append(onnx.helper.make_opsetid("com.example", 1))
    with pytest.raises(UnsupportedOperatorError,
                       match=r"3 node\(s\) that tfnet cannot convert: RandomNormalLike v1 \(x2\), "
                             r"com\.example::FancyOp \(x1\) \(vN: .*opset 17.*\)\. Supported operators .*opsets "
                             r"1-\d\d\): Abs, Acos"):
        TFNet.from_onnx(model)
    assert isinstance(UnsupportedOperatorError("x"), ValueError)


def test_old_operator_versions_are_upgraded_and_others_refused_by_name_and_version():
    """Add before version 7 broadcast only with its ``broadcast`` attribute; tfnet converts Add 7 on, and
    ``onnx.version_converter`` upgrades the opset-6 model on the way in (issue 54). An operator that no version
    converts is refused by name and version."""
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    b = numpy_helper.from_array(np.arange(4, dtype=np.float32), "b")
    node = helper.make_node("Add", ["x", "b"], ["y"], broadcast=1)
    model = helper.make_model(helper.make_graph([node], "g", [x], [helper.make_tensor_value_info("y", 1, [2, 4])],
                                                [b]), opset_imports=[helper.make_opsetid("", 6)])
    assert TFNet.from_onnx(model).forward(np.ones((2, 4), np.float32)).tolist() == [[1.0, 2.0, 3.0, 4.0]] * 2
    node = helper.make_node("RandomNormalLike", ["x4"], ["y"], seed=1.0)
    model = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x4", TensorProto.FLOAT, [1, 1, 4, 4])],
        [helper.make_tensor_value_info("y", 1, [1, 1, 4, 4])]), opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(UnsupportedOperatorError, match=r"1 node\(s\) that tfnet cannot convert: RandomNormalLike v1 \(x1\)"):
        TFNet.from_onnx(model)


def test_opset_newer_than_onnx_defines_or_missing():
    from tfnet.onnx.load import max_opset

    newest = max_opset()
    with pytest.raises(OpsetError, match=rf"uses opset {newest + 1}; tfnet converts opsets 1 to {newest}, the newest "
                                         r"that the installed onnx .* defines"):
        TFNet.from_onnx(_tiny_model("Relu", opset=newest + 1))
    model = _tiny_model("Relu")
    model.opset_import[0].domain = "com.example"
    with pytest.raises(OpsetError, match=r"imports no default-domain opset .*\['com\.example'\]"):
        TFNet.from_onnx(model)
    relu = TFNet.from_onnx(_tiny_model("Relu", opset=newest)).forward(np.array([[-1, 2, -3, 4]], np.float32))
    assert relu.tolist() == [[0, 2, 0, 4]]


def test_external_data_file_missing(tmp_path):
    model = onnx.load(path_of("digits_cnn"))
    target = tmp_path / "ext" / "model.onnx"
    target.parent.mkdir()
    onnx.save(model, str(target), save_as_external_data=True, location="weights.bin", size_threshold=0)
    x = stored("digits_cnn")["in_0"]
    assert rel(TFNet.from_onnx(str(target)).forward(x), stored("digits_cnn")["out_0"]) < 1e-4
    os.remove(tmp_path / "ext" / "weights.bin")
    with pytest.raises(ExternalDataError, match=r"external data of tensor 'features\.0\.weight' should be in .*weights\.bin"):
        TFNet.from_onnx(str(target))
    with pytest.raises(FileNotFoundError):
        TFNet.from_onnx(str(target))


def test_functions_the_model_defines_are_inlined():
    """A model-local function (``model.functions``, which PyTorch's dynamo exporter may write), called
    twice, one call inside another function: converted as its body, equal to onnxruntime."""
    from onnx import TensorProto, helper

    scaled_gelu = helper.make_function(
        "pkg.custom", "ScaledGelu", ["x", "s"], ["y"],
        [helper.make_node("Mul", ["x", "s"], ["t"]), helper.make_node("Gelu", ["t"], ["y"])],
        opset_imports=[helper.make_opsetid("", 20)])
    block = helper.make_function(
        "pkg.custom", "Block", ["x", "w", "s"], ["y"],
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("ScaledGelu", ["h", "s"], ["y"],
                                                                          domain="pkg.custom")],
        opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("pkg.custom", 1)])
    rng = np.random.default_rng(0)
    w = onnx.numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w")
    s = onnx.numpy_helper.from_array(np.array([1.5], np.float32), "s")
    nodes = [helper.make_node("Block", ["x", "w", "s"], ["a"], domain="pkg.custom"),
             helper.make_node("ScaledGelu", ["a", "s"], ["y"], domain="pkg.custom")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])], [w, s])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("pkg.custom", 1)],
                              functions=[scaled_gelu, block])
    x = rng.standard_normal((3, 4)).astype(np.float32)
    net = TFNet.from_onnx(model)
    assert rel(net.forward(x), run_ort(model, [x])[0]) < 1e-5
    assert "w" in net.weight_names


@pytest.mark.parametrize("opset", [16, 18, 19, 21, 22, 23])
def test_every_opset_in_range_converts(opset):
    """The fixtures cover opsets 13 to 18 and 20 (the dynamo exports); onnx's converter lifts the
    opset-15 CNN to the others (it has no downward BatchNormalization adapter)."""
    from onnx import version_converter

    model = version_converter.convert_version(onnx.load(path_of("digits_cnn")), opset)
    x = stored("digits_cnn")["in_0"]
    assert rel(TFNet.from_onnx(model).forward(x), run_ort(model, [x])[0]) < 1e-4


def test_lstm_with_a_dynamic_sequence_length_is_a_clear_error():
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", "batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["seq", 1, "batch", 2])
    w = helper.make_tensor("W", TensorProto.FLOAT, [1, 8, 3], np.zeros(24, np.float32))
    r = helper.make_tensor("R", TensorProto.FLOAT, [1, 8, 2], np.zeros(16, np.float32))
    node = helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=2)
    model = helper.make_model(helper.make_graph([node], "g", [x], [y], [w, r]), opset_imports=[helper.make_opsetid("", 14)])
    from tfnet.onnx import OnnxConversionError

    with pytest.raises(OnnxConversionError, match=r"LSTM .* dynamic sequence length .*needs a fixed one"):
        TFNet.from_onnx(model)


def test_bytes_input_order_and_unknown_names():
    from tfnet import TensorNameError

    data = open(path_of("transformer"), "rb").read()
    net = TFNet.from_onnx(data, inputs=["mask", "ids"], outputs="logits")
    assert net.input_names == ["mask:0", "ids:0"] and net.output_names == ["logits:0"]
    d = stored("transformer")
    np.testing.assert_allclose(net.forward([d["in_1"], d["in_0"]]), d["out_0"], rtol=1e-4, atol=1e-5)
    with pytest.raises(TensorNameError, match=r"Unknown ONNX value 'logit'\. Closest existing names: 'logits'"):
        TFNet.from_onnx(data, outputs="logit")
    with pytest.raises(TensorNameError, match=r"Unknown ONNX graph input 'id'\. Closest existing names: 'ids'"):
        TFNet.from_onnx(data, inputs=["id", "mask"])


def test_docs_operator_table_is_generated_from_the_code():
    """docs/onnx.md's table of operators and versions is what ``python -m tfnet.onnx.table`` prints."""
    from tfnet.onnx.table import markdown

    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "onnx.md")).read()
    start, end = "<!-- operator table: start -->\n", "<!-- operator table: end -->"
    table = doc[doc.index(start) + len(start):doc.index(end)].strip()
    assert table == markdown(), "regenerate the table in docs/onnx.md with: python -m tfnet.onnx.table"
    assert "| `ScatterND` | 11, 13, 16, 18 |" in table and "| `Gelu` | 20 |" in table
