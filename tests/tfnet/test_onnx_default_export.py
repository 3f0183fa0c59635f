"""PyTorch models as PyTorch exports them today (issue 32): ``torch.onnx.export(model, (x,), path,
dynamic_shapes=...)`` with torch 2.14's defaults (the dynamo exporter, opset 20, the weights in
``path + ".data"``), of torchvision's families and ``torch.nn`` models (scripts/onnx_fixture_dynamo.py).

Forward against onnxruntime and PyTorch (1e-4 relative), input gradients and initializer gradients
against PyTorch's (1e-3). The default export folds batch norms into convolutions and transposes
``Linear`` weights into new initializers; the export script matches each initializer to the PyTorch
parameter it holds (of a twin with the same batch norms folded), so the gradients compared are those of
the weights tfnet trains. Then ``cut``, ``add_head``, ``TFOptimizer`` and ``save_onnx`` on them."""

import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests.tfnet.onnx_fixtures import check_backward, check_forward, path_of, rel, run_ort, stored  # noqa: E402
from tfnet import TFNet  # noqa: E402

# name -> operators of note its export holds
MODELS = {
    "dyn_resnet": {"Conv", "MaxPool", "Gemm"},
    "dyn_mobilenet_v3": {"HardSwish", "HardSigmoid"},
    "dyn_efficientnet": {"Sigmoid", "Mul"},
    "dyn_convnext": {"LayerNormalization", "Gelu"},
    "dyn_vit": {"Gelu", "LayerNormalization", "Softmax"},
    "dyn_swin": {"ScatterND", "Gelu"},
    "dyn_encoder": {"Where", "Not", "Softmax"},
    "dyn_decoder": {"Trilu", "Gelu"},
    "dyn_gru_text": {"GRU"},
    "dyn_super_resolution": {"DepthToSpace"},
    "dyn_xception": {"Conv", "Add", "Relu", "MaxPool"},  # sums read by the next block's Relu and sum: remapper_guard
    "dyn_roi_head": {"RoiAlign", "Range", "Tile"},  # torchvision's roi_align, aligned and adaptive, on run-time rois
    "dyn_fold": {"Col2Im", "Gather", "Pad"},  # nn.Fold after nn.Unfold (which the export writes as gathers)
    "dyn_deform": {"DeformConv", "Sigmoid"},  # torchvision DeformConv2d: modulated, grouped, strided; dilated
}
_NETS = {}


def net_of(name):
    if name not in _NETS:
        _NETS[name] = TFNet.from_onnx(path_of(name))
    return _NETS[name]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_default_exports_forward_and_differentiate_as_pytorch(name):
    model = onnx.load(path_of(name), load_external_data=False)
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [20]
    assert os.path.isfile(path_of(name) + ".data"), "the weights live beside the .onnx file"
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    assert MODELS[name] <= {n.op_type for n in model.graph.node}
    net = net_of(name)
    check_forward(net, name)
    compared = check_backward(net, name)
    # every weight tfnet trains is compared with PyTorch, except constants the exporter computed
    # from several parameters (listed by the export script)
    unmatched = set(stored(name)["unmatched"].tolist())
    assert set(net.trainable) - set(compared) <= unmatched, sorted(set(net.trainable) - set(compared))
    assert len(compared) >= 0.75 * len(net.trainable)


def _classification_data(name, rng, n=16):
    """``n`` inputs like the fixture's and labels that depend on them (learnable)."""
    x = stored(name)["in_0"]
    if x.dtype.kind == "f":
        x = rng.standard_normal((n, *x.shape[1:])).astype(x.dtype)
        y = (x.reshape(n, -1).mean(1) > 0).astype(np.int64)
    else:
        x = rng.integers(0, 30, (n, *x.shape[1:])).astype(x.dtype)
        y = (x[:, -1] % 2).astype(np.int64)
    return x, y


def _sce(y, logits):
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(tf.cast(tf.reshape(y, [-1]), tf.int32),
                                                                         logits))


@pytest.mark.parametrize("name,features_of", [
    ("dyn_resnet", lambda m: [n for n in m.graph.node if n.op_type == "Gemm"][0].input[0]),
    ("dyn_vit", lambda m: [n for n in m.graph.node if n.op_type == "Gemm"][-1].input[0]),
    ("dyn_gru_text", lambda m: [n for n in m.graph.node if n.op_type == "Gemm"][-1].input[0]),
])
def test_cut_add_head_fine_tune_and_save_onnx(tmp_path, name, features_of):
    """The features before the classifier, a new Keras head, four epochs of TFOptimizer on the whole
    net (its loss goes down), then save_onnx: onnxruntime runs the file and agrees with the net."""
    import optim
    from optim import TFOptimizer

    features = features_of(onnx.load(path_of(name), load_external_data=False))
    body = TFNet.from_onnx(path_of(name), outputs=features, name=name)
    keras.utils.set_random_seed(0)
    net = body.cut(body.output_names).add_head([keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)],
                                                name="head")
    x, y = _classification_data(name, np.random.default_rng(0))
    first = next(w for w in net.trainable if not w.startswith("head/"))
    before, loss_before = net.get_weights([first])[first], float(_sce(y, net.forward(x)))
    TFOptimizer(net, _sce, optim.Adam(1e-2)).optimize((x, y), epochs=4, batch_size=8, verbose=0)
    assert float(_sce(y, net.forward(x))) < loss_before
    assert np.abs(net.get_weights([first])[first] - before).max() > 1e-4, "the body was fine-tuned"
    out = str(tmp_path / "tuned.onnx")
    net.save_onnx(out)
    want = net.forward(x)
    assert rel(run_ort(out, [x])[0], want) < 1e-4
    np.testing.assert_allclose(TFNet.from_onnx(out).forward(x), want, rtol=1e-4, atol=1e-5)
    # the untouched net writes back the whole graph, with its external weights now inside the file
    whole = str(tmp_path / "whole.onnx")
    full = TFNet.from_onnx(path_of(name))
    full.save_onnx(whole)
    data = stored(name)
    assert rel(run_ort(whole, [data["in_0"]])[0], data["out_0"]) < 1e-4


def test_a_padding_mask_changes_only_what_it_masks():
    """The encoder averages over the tokens its padding mask keeps: the padded positions' ids do not
    change the output, the kept ones do."""
    net = net_of("dyn_encoder")
    data = stored("dyn_encoder")
    ids, padding = data["in_0"].copy(), data["in_1"]
    base = net.forward([ids, padding])
    ids[1, 4:] = (ids[1, 4:] + 7) % 40  # the padded tokens of row 1
    np.testing.assert_allclose(net.forward([ids, padding]), base, rtol=1e-5, atol=1e-6)
    ids[1, 0] = (ids[1, 0] + 7) % 40
    assert np.abs(net.forward([ids, padding])[1] - base[1]).max() > 1e-3


def test_the_causal_decoder_does_not_look_ahead():
    """Changing the last token changes only the last position's logits (the Trilu mask)."""
    net = net_of("dyn_decoder")
    ids = stored("dyn_decoder")["in_0"].copy()
    base = net.forward(ids)
    ids[:, -1] = (ids[:, -1] + 5) % 40
    moved = net.forward(ids)
    np.testing.assert_allclose(moved[:, :-1], base[:, :-1], rtol=1e-5, atol=1e-6)
    assert np.abs(moved[:, -1] - base[:, -1]).max() > 1e-3
