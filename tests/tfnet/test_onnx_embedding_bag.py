"""PyTorch's default export of ``nn.EmbeddingBag`` (issue 54): a ``Loop`` over the bags that ``SequenceInsert`` s
each bag's row (``If`` s on the bag's bounds in its body), then ``ConcatFromSequence``. Exported by
tests/tfnet/onnx_embedding_bag_export.py with ``torch.onnx.export``'s defaults (dynamo, opset 20), modes "sum" and
"mean", four bags over a vocabulary of 10 (the third bag empty). Compared with what PyTorch computed there: the
output (1e-6 relative), the embedding's gradient of a scalar loss (1e-5 relative) and five steps of plain SGD
(the loss before each step and the embedding after them)."""

import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import tensorflow as tf  # noqa: E402

from tfnet import TFNet  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "onnx_embedding_bag")
MODES = ("sum", "mean")


def stored(mode):
    return dict(np.load(os.path.join(FIXTURES, mode + ".npz")))


def net_of(mode):
    """The converted net, training the embedding only: tfnet makes every float initializer a weight, and the export
    holds one more, ``tmp`` (the per-sample weights of 1 that PyTorch multiplies the rows by, not a parameter)."""
    net = TFNet.from_onnx(os.path.join(FIXTURES, mode + ".onnx"))
    assert sorted(net.trainable) == ["bag.weight", "tmp"]
    net.trainable = ["bag.weight"]
    return net


def rel(got, want):
    return float(np.abs(np.asarray(got) - want).max() / np.abs(want).max())


@pytest.mark.parametrize("mode", MODES)
def test_the_default_export_is_a_loop_over_sequences(mode):
    model = onnx.load(os.path.join(FIXTURES, mode + ".onnx"))
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [20]
    ops = {n.op_type for n in model.graph.node}
    assert {"Loop", "SequenceEmpty", "ConcatFromSequence"} <= ops
    loop = next(n for n in model.graph.node if n.op_type == "Loop")
    body = {n.op_type for n in loop.attribute[0].g.node}
    assert {"SequenceInsert", "If", "Slice"} <= body


@pytest.mark.parametrize("mode", MODES)
def test_forward_and_embedding_gradient_equal_pytorchs(mode):
    data = stored(mode)
    net = net_of(mode)
    inputs = [data["in_0"], data["in_1"]]
    out = net.forward(inputs)
    print(f"\n{mode}: forward max abs {np.abs(out - data['out_0']).max():.2e}, rel {rel(out, data['out_0']):.2e}")
    np.testing.assert_allclose(out, data["out_0"], rtol=1e-6, atol=1e-7)
    assert not out[2].any()  # the empty bag
    _, grads = net.backward(inputs, [data["grad_out_0"]])
    got, want = grads["bag.weight"], data["grad_w/bag.weight"]
    print(f"{mode}: embedding gradient max abs {np.abs(got - want).max():.2e}, rel {rel(got, want):.2e}")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert (want[[6, 8]] == 0).all() and want[[1, 2, 9]].any()  # rows of tokens no bag holds get nothing


@pytest.mark.parametrize("mode", MODES)
def test_sgd_through_tfnet_trains_the_embedding_as_pytorch_does(mode):
    data = stored(mode)
    net = net_of(mode)
    np.testing.assert_array_equal(net.get_weights()["bag.weight"], data["weight"])
    step = net.train_step(lambda target, out: tf.reduce_mean(tf.square(out - target)), 2.0)
    state = step.init_state()
    losses = []
    for _ in range(len(data["sgd_loss"])):
        result = step([data["in_0"], data["in_1"]], data["target"], state)
        state = result.state
        losses.append(float(result.loss))
    weight = net.get_weights()["bag.weight"]
    print(f"{mode}: SGD losses {np.round(losses, 4).tolist()}, max rel from PyTorch's {rel(losses, data['sgd_loss']):.1e}; "
          f"embedding after them max abs {np.abs(weight - data['sgd_weight']).max():.1e}")
    assert losses[-1] < 0.85 * losses[0]
    np.testing.assert_allclose(losses, data["sgd_loss"], rtol=1e-5)
    np.testing.assert_allclose(weight, data["sgd_weight"], rtol=1e-5, atol=1e-6)
