"""ONNX's own ``Loop`` node cases (``onnx.backend.test.case.node.collect_testcases``: ``test_loop11``,
``test_loop13_seq``, ``test_loop16_seq_none``) through tfnet, against the cases' expected outputs and onnx's
reference evaluator (issue 54).

``test_loop11`` runs as the conformance tier runs it (the trip count fed, the other inputs initializers). tfnet
takes and returns tensors only, so ``test_loop13_seq``'s sequence input (an empty sequence) becomes a
``SequenceEmpty`` node and its sequence output is read through ``ConcatFromSequence``, ``SequenceLength`` and
``SequenceAt(-1)``; ``test_loop16_seq_none`` (an optional sequence) stays refused."""

import functools

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from tfnet import TFNet  # noqa: E402
from tfnet.onnx import OnnxConversionError  # noqa: E402
from tfnet.onnx.conformance import run_case  # noqa: E402


@functools.cache
def _loop_cases():
    """The Loop cases only: importing onnx's module of them makes them (collect_testcases makes all ~1,900)."""
    import importlib

    from onnx.backend.test.case import node

    importlib.import_module("onnx.backend.test.case.node.loop")
    return {c.name: c for c in node._NodeTestCases if c.name.startswith("test_loop")}


def case(name):
    return _loop_cases()[name]


def test_loop11_equals_the_expected_outputs_and_differentiates():
    c = case("test_loop11")
    assert run_case(c).outcome == "pass"
    model = onnx.ModelProto()
    model.CopyFrom(c.model)
    (trips, cond, y), want = c.data_sets[0]
    model.graph.initializer.extend([numpy_helper.from_array(cond, "cond"), numpy_helper.from_array(y, "y")])
    net = TFNet.from_onnx(model, relax_batch=False)
    assert net.trainable == ["y"]
    for n in (1, 3, 5):
        got = net.forward(np.array(n, np.int64))
        ref = ReferenceEvaluator(c.model).run(None, {"trip_count": np.array(n, np.int64), "cond": cond, "y": y})
        for g, r in zip(got, ref):
            assert g.shape == r.shape and np.array_equal(g, r), (n, g, r)
    np.testing.assert_array_equal(net.forward(np.array(5, np.int64))[1], want[1])
    # d/dy of sum(res_y * a) + sum(res_scan * b): every step adds y once
    a, b = np.array([2.0], np.float32), np.arange(1, 6, dtype=np.float32).reshape(5, 1)
    _, grads = net.backward(np.array(5, np.int64), [a, b])
    assert grads["y"].tolist() == [2.0 + 15.0]


def _seq13_as_tensors():
    """``test_loop13_seq`` with its empty sequence made inside and its result read as tensors."""
    c = case("test_loop13_seq")
    graph = c.model.graph
    loop = graph.node[0]
    nodes = [helper.make_node("SequenceEmpty", [], ["seq_empty"], dtype=TensorProto.FLOAT), loop,
             helper.make_node("ConcatFromSequence", ["seq_res"], ["flat"], axis=0),
             helper.make_node("SequenceLength", ["seq_res"], ["count"]),
             helper.make_node("Constant", [], ["last_pos"], value=helper.make_tensor("v", TensorProto.INT64, [], [-1])),
             helper.make_node("SequenceAt", ["seq_res", "last_pos"], ["last"])]
    outputs = [helper.make_tensor_value_info("flat", TensorProto.FLOAT, [None]),
               helper.make_tensor_value_info("count", TensorProto.INT64, []),
               helper.make_tensor_value_info("last", TensorProto.FLOAT, [None])]
    g = helper.make_graph(nodes, "loop13_seq_as_tensors", [graph.input[0]], outputs,
                          [numpy_helper.from_array(np.array(True), "cond")])
    return c, helper.make_model(g, opset_imports=c.model.opset_import)


def test_loop13_seq_carries_a_sequence_of_growing_tensors():
    c, model = _seq13_as_tensors()
    net = TFNet.from_onnx(model, relax_batch=False)
    (trips, _, _), (want,) = c.data_sets[0]
    flat, count, last = net.forward(np.asarray(trips))
    np.testing.assert_array_equal(flat, np.concatenate(want))
    assert int(count) == len(want) == 5 and last.tolist() == want[-1].tolist()
    reference = ReferenceEvaluator(model)
    for n in (1, 2, 7):  # 7: the slice of the 5 values stops at their end
        got = net.forward(np.array(n, np.int64))
        for g, r in zip(got, reference.run(None, {"trip_count": np.array(n, np.int64)})):
            assert np.array_equal(g, r), (n, g, r)


def test_loop16_seq_none_an_optional_sequence_input_is_refused_by_name():
    """The graph's own input is an optional sequence (its Optional* nodes convert): refused at load, by name and type,
    as its sequence output would be (a raw KeyError from onnx's dtype table before)."""
    c = case("test_loop16_seq_none")
    with pytest.raises(OnnxConversionError, match=r"The ONNX graph's input 'opt_seq' is an optional of a sequence of "
                                                  r"tensors: a TFNet takes and gives tensors"):
        TFNet.from_onnx(c.model, relax_batch=False)
    split = helper.make_node("SplitToSequence", ["x"], ["parts"], axis=0)
    graph = helper.make_graph([split], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 2])],
                              [helper.make_tensor_sequence_value_info("parts", TensorProto.FLOAT, None)])
    with pytest.raises(OnnxConversionError, match=r"The ONNX graph's output 'parts' is a sequence of tensors"):
        TFNet.from_onnx(helper.make_model(graph, opset_imports=c.model.opset_import), relax_batch=False)
