"""ONNX's own backend conformance suite through tfnet (issue 32).

``onnx.backend.test.case.node.collect_testcases()`` (about 1,900 single-operator models with numpy
reference outputs, shipped in the ``onnx`` wheel) run by :mod:`tfnet.onnx.conformance`: each case through
``TFNet.from_onnx`` and ``forward``, its outputs compared as onnx's backend runner compares them (dtype,
then ``assert_allclose`` with the case's tolerances).

Because a TFNet batches its inputs (every input shares dimension 0), **the inputs after the first are
made initializers** holding the case's values (the operator's parameters: the float ones become weights
of the net), and the models' shapes are taken as declared (``relax_batch=False``). In scope: the default
domain, tensor inputs and outputs, inference (no random generators, no training-mode Dropout or
BatchNormalization). The module prints the counts (pass / wrong / unsupported / error) and every failure.

The cases that pass are a committed list, ``tests/fixtures/onnx_conformance_passing.txt`` (made by
``scripts/onnx_conformance_passing.py``): the test fails naming every listed case that no longer passes, so
no case can regress unseen or be masked by a fix elsewhere. A case that passes beyond the list is printed:
add it by running the script again.
"""

import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from tests.conftest import lane_cores  # noqa: E402
from tfnet.onnx.conformance import OUTCOMES, run_suite  # noqa: E402

PASSING = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "onnx_conformance_passing.txt")


def extra_requirements() -> list[str]:
    """The requirements of setup.py's ``test`` extra, as written (its ``EXTRAS`` dict, read with ``ast``)."""
    import ast

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "setup.py")) as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "EXTRAS" for t in node.targets):
            extras = {k.value: v for k, v in zip(node.value.keys, node.value.values)}
            return [item.value for item in extras["test"].elts]
    raise AssertionError("setup.py has no EXTRAS dict")


def passing_list() -> tuple[str, set[str]]:
    """The onnx version the committed list was made with, and the names it lists."""
    with open(PASSING) as f:
        lines = f.read().splitlines()
    version = lines[0].split()[2].rstrip(":")  # "# onnx 1.23.2: ..."
    return version, {line.strip() for line in lines if line.strip() and not line.startswith("#")}


@pytest.fixture(scope="module")
def report():
    return run_suite(processes=min(2, lane_cores()))  # fresh processes share the cases, one per core of the lane


def test_every_case_on_the_committed_list_still_passes(report, summary_line):
    version, listed = passing_list()
    for line in report.summary().splitlines():
        summary_line(line)
    counts = report.counts
    assert report.in_scope == sum(counts[o] for o in OUTCOMES) > 1700
    assert f"onnx=={version}" in extra_requirements(), f"setup.py's test extra must pin the onnx the list was made with ({version})"
    assert onnx.__version__ == version, (f"the list of passing cases was made with onnx {version}; this is onnx "
                                         f"{onnx.__version__}: install the test extra, or move the pin and run "
                                         "scripts/onnx_conformance_passing.py")
    by_name = {r.name: r for r in report.results}
    gone = sorted(name for name in listed if name not in by_name)
    lost = sorted(name for name in listed if name in by_name and by_name[name].outcome != "pass")
    extra = sorted(r.name for r in report.results if r.outcome == "pass" and r.name not in listed)
    if extra:
        summary_line(f"{len(extra)} case(s) pass beyond the committed list (run scripts/onnx_conformance_passing.py): "
                     + ", ".join(extra))
    assert not gone, f"listed cases that onnx {onnx.__version__} no longer has: {gone}"
    assert not lost, f"{len(lost)} listed case(s) no longer pass:\n" + "\n".join(
        f"  {by_name[name].outcome:11s} {name}: {by_name[name].detail}" for name in lost)
    assert counts["pass"] == len(listed) + len(extra)


def test_what_does_not_convert_fails_at_load_by_name(report):
    """No case fails when it runs: what tfnet cannot convert is refused while loading, and the refusal
    names the operator and its version. The one exception is in the data: ``ImageDecoder`` on an image whose format
    TensorFlow cannot decode (JPEG 2000, TIFF, PNM), a typed error that names the formats it can."""
    failures = report.failures()
    at_run_time = [r for r in failures if "GraphExecutionError" in r.detail]
    undecodable = {f"test_image_decoder_decode_{f}_rgb" for f in ("jpeg2k", "tiff", "pnm")}
    assert {r.name for r in at_run_time} <= undecodable, at_run_time
    assert all("Unknown image file format. One of JPEG" in r.detail for r in at_run_time), at_run_time
    # every in-scope operator converts since 2026-12-05 (refusal by name: test_onnx.py's RandomNormalLike)
    unsupported = [r for r in failures if r.outcome == "unsupported"]
    assert all("that tfnet cannot convert:" in r.detail and " v" in r.detail for r in unsupported), unsupported


def test_a_float_cast_to_4_bits_is_compared_where_onnx_defines_it():
    """onnx's expected values for a float Cast to UINT4 come from ml_dtypes when the cases are collected, and differ
    between its versions outside the type's range (0.5 wraps -9 to 7, 0.7 gives 0; ONNX leaves it undefined): those
    positions are not compared, every other one is, and a wrong value in the range still fails the case."""
    import dataclasses

    from onnx import numpy_helper

    from tfnet.onnx.conformance import collect, defined_positions, run_case

    (case,) = [c for c in collect("test_cast_FLOAT_to_UINT4") if c.name == "test_cast_FLOAT_to_UINT4"]
    inputs, outputs = case.data_sets[0]
    x = numpy_helper.to_array(inputs[0])
    assert x.ravel().tolist() == list(range(-9, 16))
    defined = defined_positions(case.model, inputs)
    assert defined.ravel().tolist() == [False] * 9 + [True] * 16  # -9..-1 out of UINT4's range
    assert run_case(case).outcome == "pass"
    for wrap_or_zero in (7, 0):  # what ml_dtypes 0.5 and 0.7 expect of -9: either passes
        want = numpy_helper.to_array(outputs[0]).astype(np.uint8).ravel()
        want[0] = wrap_or_zero
        changed = dataclasses.replace(case, data_sets=[(inputs, [_uint4(want.reshape(x.shape))])])
        assert run_case(changed).outcome == "pass"
    want[12] = 4  # the input 3 expected as 4: in the range, so compared
    changed = dataclasses.replace(case, data_sets=[(inputs, [_uint4(want.reshape(x.shape))])])
    assert run_case(changed).outcome == "wrong"
    (f32,) = [c for c in collect("test_cast_FLOAT_to_FLOAT16") if c.name == "test_cast_FLOAT_to_FLOAT16"]
    assert defined_positions(f32.model, f32.data_sets[0][0]) is None  # every other case: all compared


def _uint4(values: np.ndarray):
    import ml_dtypes
    from onnx import numpy_helper

    return numpy_helper.from_array(values.astype(ml_dtypes.uint4), "output")
