"""ONNX's own model-level backend tests through tfnet (issue 54).

The model folders that ship in the ``onnx`` wheel under ``onnx/backend/test/data/`` (``pytorch-converted``,
``pytorch-operator``, ``simple``, and the nine networks of ``light`` with the inputs onnx's runner makes), run
by :mod:`tfnet.onnx.model_suite`: each through ``TFNet.from_onnx`` (old opsets upgraded by
``onnx.version_converter``) and ``forward``, compared with the case's own ``rtol`` and ``atol``. The training
domain (``Gradient``) is out of scope.

The cases that do not pass are a committed list with their reasons,
``tests/fixtures/onnx_model_suite_known.txt`` (made by ``scripts/onnx_model_suite_known.py``). The test fails on
any other case that does not pass, on a listed case that passes (so the list stays true), on a case that takes
more than 10 s of CPU, and below 95% of the in-scope cases passing.
"""

import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper  # noqa: E402

from tfnet import TFNet  # noqa: E402
from tfnet.errors import InputSpecError  # noqa: E402
from tfnet.onnx.model_suite import FOLDERS, OUTCOMES, read_known, run_suite  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KNOWN = os.path.join(ROOT, "tests", "fixtures", "onnx_model_suite_known.txt")
CASE_SECONDS = 10.0


def known_list() -> tuple[str, dict[str, str]]:
    """The onnx version the committed list was made with, and ``{folder/case: reason}``."""
    with open(KNOWN) as f:
        version = f.readline().split()[2].rstrip(":")  # "# onnx 1.23.2: ..."
    return version, read_known(KNOWN)


@pytest.fixture(scope="module")
def report():
    return run_suite(processes=2)  # two fresh processes share the cases: the tier's time on 2 cores


@pytest.mark.slow  # the tier: about 30 s on 2 cores, the nine light networks most of it
def test_every_case_passes_or_is_known_with_its_reason(report, summary_line):
    version, known = known_list()
    for line in report.summary().splitlines():
        summary_line(line)
    assert onnx.__version__ == version, (f"the list of known failures was made with onnx {version}; this is onnx "
                                         f"{onnx.__version__}: install the test extra, or run "
                                         "scripts/onnx_model_suite_known.py")
    assert all(known.values()), "every known failure gives its reason"
    by_name = {r.name: r for r in report.results}
    assert {r.folder for r in report.results} == set(FOLDERS)
    assert report.in_scope == sum(report.counts[o] for o in OUTCOMES) >= 140
    gone = sorted(set(known) - set(by_name))
    new = [r for r in report.failures() if r.name not in known]
    fixed = sorted(name for name in known if name in by_name and by_name[name].outcome == "pass")
    assert not gone, f"listed cases that onnx {onnx.__version__} no longer has: {gone}"
    assert not new, f"{len(new)} case(s) fail that are not on the known list:\n" + "\n".join(
        f"  {r.outcome:11s} {r.name}: {r.detail}" for r in new)
    assert not fixed, (f"{len(fixed)} listed case(s) now pass: take them off {KNOWN} (run "
                       f"scripts/onnx_model_suite_known.py): {fixed}")
    assert report.pass_rate >= 0.95, f"{100 * report.pass_rate:.1f}% of the in-scope cases pass; expected >= 95%"


@pytest.mark.slow
def test_no_case_takes_more_than_ten_seconds(report, summary_line):
    """Load, convert and forward every data set, in the CPU time of the case's process (every thread): on a
    machine shared with other work the wall-clock time also counts theirs. Both are printed."""
    slowest = sorted(report.results, key=lambda r: -r.cpu_seconds)[:3]
    summary_line("slowest cases: " + ", ".join(f"{r.name} {r.cpu_seconds:.1f} s of CPU ({r.seconds:.1f} s)"
                                               for r in slowest))
    slow = [r for r in slowest if r.cpu_seconds > CASE_SECONDS]
    assert not slow, "cases over 10 s: " + ", ".join(f"{r.name} {r.cpu_seconds:.1f} s of CPU" for r in slow)


@pytest.mark.slow
def test_the_nine_light_networks_pass(report):
    light = [r for r in report.results if r.folder == "light"]
    assert len(light) == 9 and all(r.outcome == "pass" for r in light), [r for r in light if r.outcome != "pass"]


def _two_input_model(op, a, b, out, **attrs):
    graph = helper.make_graph([helper.make_node(op, ["a", "b"], ["y"], **attrs)], "g",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, a),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, b)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_inputs_without_a_shared_batch_are_whole_tensors():
    """Fixed leading sizes that differ (a matrix times a matrix), or fixed beside symbolic ones: those inputs keep
    their shapes and forward takes them whole; inputs that take a batch must still agree on it."""
    rng = np.random.default_rng(54)
    a, b = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    mm = TFNet.from_onnx(_two_input_model("MatMul", [2, 3], [3, 4], [2, 4]))
    assert [s.shape.as_list() for s in mm.input_specs] == [[2, 3], [3, 4]]
    np.testing.assert_allclose(mm.forward([a, b]), a @ b, rtol=1e-6)

    add = TFNet.from_onnx(_two_input_model("Add", ["n", 3], [1, 3], ["n", 3]))  # b: one row, not a batch
    assert [s.shape.as_list() for s in add.input_specs] == [[None, 3], [1, 3]]
    x, row = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((1, 3)).astype(np.float32)
    np.testing.assert_allclose(add.forward([x, row], batch_size=2), x + row, rtol=1e-6)  # b whole in each chunk

    same = TFNet.from_onnx(_two_input_model("Add", ["n", 3], ["n", 3], ["n", 3]))
    with pytest.raises(InputSpecError, match=r"same batch size; received sizes \[2, 3\]"):
        same.forward([np.zeros((2, 3)), np.zeros((3, 3))])
    fixed = TFNet.from_onnx(_two_input_model("Add", [1, 3], [1, 3], [1, 3]))  # no dynamic axes: one batch, opened
    assert [s.shape.as_list() for s in fixed.input_specs] == [[None, 3], [None, 3]]


def test_a_sequence_split_along_the_open_batch_axis():
    """SplitToSequence without sizes along dimension 0 that relax_batch opens: a sequence as long as the batch
    (SequenceAt with a negative position, SequenceLength, ConcatFromSequence back), against onnx's reference."""
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    nodes = [helper.make_node("SplitToSequence", ["x"], ["s"], axis=0, keepdims=0),
             helper.make_node("SequenceAt", ["s", "last"], ["at"]),
             helper.make_node("SequenceLength", ["s"], ["n"]),
             helper.make_node("ConcatFromSequence", ["s"], ["back"], axis=0, new_axis=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("at", TensorProto.FLOAT, [3]),
                               helper.make_tensor_value_info("n", TensorProto.INT64, []),
                               helper.make_tensor_value_info("back", TensorProto.FLOAT, [2, 3])],
                              [numpy_helper.from_array(np.array(-1, np.int64), "last")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.arange(15, dtype=np.float32).reshape(5, 3)  # 5 rows where the model declared 2: the batch is open
    got = TFNet.from_onnx(model).forward(x)
    want = ReferenceEvaluator(model).run(None, {"x": x})
    assert [g.tolist() for g in got] == [w.tolist() for w in want] and int(got[1]) == 5
