"""ONNX's own backend conformance suite through tfnet (issue 32).

``onnx.backend.test.case.node.collect_testcases()`` (about 1,900 single-operator models with numpy
reference outputs, shipped in the ``onnx`` wheel) run by :mod:`tfnet.onnx.conformance`: each case through
``TFNet.from_onnx`` and ``forward``, its outputs compared as onnx's backend runner compares them (dtype,
then ``assert_allclose`` with the case's tolerances).

Because a TFNet batches its inputs (every input shares dimension 0), **the inputs after the first are
made initializers** holding the case's values (the operator's parameters: the float ones become weights
of the net), and the models' shapes are taken as declared (``relax_batch=False``). In scope: the default
domain, tensor inputs and outputs, inference (no random generators, no training-mode Dropout or
BatchNormalization). The module prints the counts (pass / wrong / unsupported / error) and every failure,
and fails when the pass rate of the in-scope cases falls under FLOOR, set at what tfnet reaches.
"""

import pytest

pytest.importorskip("onnx")

from tfnet.onnx.conformance import OUTCOMES, run_suite  # noqa: E402

# onnx 1.23.2: 1,742 of 1,804 in-scope cases pass (96.6%); the floor leaves a case or two for numerics
FLOOR = 0.96


@pytest.fixture(scope="module")
def report():
    return run_suite(processes=2)  # two fresh processes share the cases: the suite's time on 2 cores


def test_conformance_suite_pass_rate(report, capsys):
    with capsys.disabled():
        print("\n" + report.summary())
    counts = report.counts
    assert report.in_scope == sum(counts[o] for o in OUTCOMES) > 1700
    assert report.pass_rate >= FLOOR, (
        f"{counts['pass']} of {report.in_scope} in-scope ONNX conformance cases pass ({100 * report.pass_rate:.1f}%), "
        f"under the floor of {100 * FLOOR:.0f}%; failures:\n" + report.summary())


def test_what_does_not_convert_fails_at_load_by_name(report):
    """No case fails when it runs: what tfnet cannot convert is refused while loading, and the refusal
    names the operator and its version."""
    failures = report.failures()
    assert not [r for r in failures if "GraphExecutionError" in r.detail], [r for r in failures
                                                                              if "GraphExecutionError" in r.detail]
    unsupported = [r for r in failures if r.outcome == "unsupported"]
    assert unsupported and all("that tfnet cannot convert:" in r.detail and " v" in r.detail for r in unsupported)
