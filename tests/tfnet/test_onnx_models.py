"""torchvision's model classes at tiny widths (scripts/onnx_fixture_vision.py), exported by real
PyTorch at opsets 13 to 18 (legacy exporter): forward against onnxruntime and PyTorch, input and weight gradients
against PyTorch's. Parameters the exporter merged into one initializer (equal initial values, such as
LayerNorm's ones) are compared as the sum of their gradients; GoogLeNet keeps torchvision's own
initialisation, where the exporter also merges batch-norm biases with running means.

The segmentation heads (issue 32): LR-ASPP and DeepLabV3 on a narrow MobileNetV3-Large backbone resize
one branch to another's size, ``F.interpolate(x, size=y.shape[-2:])``; the legacy exporter writes the
size as ``Shape`` of ``y`` (held in NHWC by tfnet) gathered and concatenated at run time."""

import numpy as np
import onnx
import pytest

pytest.importorskip("onnxruntime")

from tests.tfnet.onnx_fixtures import (  # noqa: E402
    check_backward,
    check_forward,
    gradient_error,
    path_of,
    rel,
    run_ort,
    stored,
)
from tfnet import TFNet  # noqa: E402

# name -> (opset, parameters merged by the exporter into shared initializers)
MODELS = {
    "mobilenet_v3": (17, True), "efficientnet": (15, True), "regnet": (14, False), "densenet": (13, False),
    "shufflenet": (16, False), "squeezenet": (13, False), "mnasnet": (18, False), "googlenet": (17, True),
    "vit": (17, True), "swin": (17, True), "lraspp": (17, False), "deeplabv3": (17, False),
    "roi_pool": (17, False),  # torchvision's roi_pool (MaxRoiPool) on regions past the border, empty bins, half rounding
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_torchvision_models_forward_and_gradients(name):
    opset, merged = MODELS[name]
    model = onnx.load(path_of(name))
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [opset]
    net = TFNet.from_onnx(path_of(name))
    check_forward(net, name)
    check_backward(net, name)
    groups = {k[len("merged/"):]: list(v) for k, v in stored(name).items() if k.startswith("merged/")}
    assert bool(groups) == merged
    for init, params in groups.items():  # one weight of the net stands for several PyTorch parameters
        assert init in net.weight_names and len(params) >= 2
        assert not set(params) - {init} & set(net.weight_names)
    if name == "vit":  # LayerNorm's initial ones: one initializer for five parameters
        assert max(len(p) for p in groups.values()) >= 5
    if name == "googlenet":  # torchvision's own initialisation: the input's gradient vanishes (about 1e-20)
        assert np.abs(stored(name)["grad_in_0"]).max() < 1e-12
    assert np.isfinite(net.forward(stored(name)["in_0"])).all()


@pytest.mark.parametrize("name", ["lraspp", "deeplabv3"])
def test_segmentation_heads_resize_to_a_size_read_from_another_branch(name):
    """Every Resize of the head takes its ``sizes`` from a ``Shape`` of another tensor (not a constant),
    and the output has the input's spatial size, as PyTorch's does."""
    model = onnx.load(path_of(name))
    producers = {o: n for n in model.graph.node for o in n.output}
    resizes = [n for n in model.graph.node if n.op_type == "Resize"]
    assert resizes and all(producers[n.input[3]].op_type == "Concat" for n in resizes)
    x = stored(name)["in_0"]
    out = TFNet.from_onnx(path_of(name)).forward(x)
    assert out.shape == stored(name)["out_0"].shape == (2, 3, *x.shape[2:])


@pytest.mark.parametrize("name,heads", [("faster_rcnn", 8), ("mask_rcnn", 14)])
def test_two_stage_detectors_as_torchvision_exports_them_detect_what_pytorch_does(name, heads):
    """torchvision's ``FasterRCNN`` and ``MaskRCNN`` at a tiny size (scripts/onnx_fixture_dynamo.py::TinyDetector,
    TinyMaskDetector; the legacy exporter, opset 17: the dynamo one cannot trace them): region proposals, their NMS
    and the detections' batched NMS each inside an ``If`` on whether any box is left, with int64's largest value as
    the per-class limit (TensorFlow's NMS takes an int32), slices whose axes the branch computes from the graph's
    constants, ``RoiAlign``, ``TopK``; Mask R-CNN's masks pasted at their boxes' sizes in a ``Loop`` (a ``Resize`` to
    sizes known only at run time, an ``Unsqueeze`` of its stacked outputs, of unknown rank). Boxes, scores, labels
    (and masks) as onnxruntime and PyTorch give them; the gradients of every weight of the box and mask heads as
    PyTorch's (``RoiAlign`` reads its regions without differentiating them, as torchvision's). The backbone's and the
    proposal network's are not compared: PyTorch detaches the proposals (``.detach()``), which an ONNX graph cannot
    say, so tfnet differentiates the final boxes' decoding through them too."""
    data = stored(name)
    x = data["in_0"]
    net = TFNet.from_onnx(path_of(name), relax_batch=False)  # one image (C, H, W), as torchvision's detectors take
    outs = net.forward(x)
    assert len(np.unique(outs[1])) == len(outs[1]) >= 6  # distinct scores: the NMS chose among them
    for k, (got, ort_out) in enumerate(zip(outs, run_ort(path_of(name), [x]))):
        assert rel(got, ort_out) < 1e-4 and rel(got, data[f"out_{k}"]) < 1e-4, (k, rel(got, ort_out))
    np.testing.assert_array_equal(outs[2], data["out_2"])
    given = [data[f"grad_out_{k}"] if k != 2 else None for k in range(len(outs))]  # labels: integers, no gradient
    _, grad_w = net.backward(x, given)
    want = {k[len("grad_w/"):]: v for k, v in data.items() if k.startswith("grad_w/detector.roi_heads.")}
    assert len(want) == heads
    largest = max(np.abs(g).max() for g in want.values())
    errors = {n: gradient_error(grad_w[n], g, largest) for n, g in want.items()}
    assert max(errors.values()) < 1e-3, errors
