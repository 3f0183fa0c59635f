"""ONNX's own backend conformance suite, run through tfnet.

``onnx.backend.test.case.node.collect_testcases()`` holds about 1,900 single-operator models with
numpy reference outputs (the suite every ONNX backend runs). Each case is converted with
``TFNet.from_onnx`` and run with ``forward``, and its outputs compared as onnx's backend runner
compares them (same dtype, ``np.testing.assert_allclose`` with the case's ``rtol`` and ``atol``,
strings exactly). Two adaptations, both because a TFNet is a function of a batch:

* the inputs after the first are made initializers holding the case's values (tfnet feeds every input
  with the same batch dimension; these are the parameters of the operator under test), so float ones
  become weights of the net, the rest constants;
* the model's shapes are used as declared (``relax_batch=False``): a case's first dimension is
  rarely a batch.

Values of the 8-bit and 4-bit element types are fed and compared in their carrier types
(:mod:`tfnet.onnx.dtypes`). A float ``Cast`` or ``CastLike`` to a 2- or 4-bit integer is compared only where the
spec defines it: where the input, truncated, is in the type's range (:func:`defined_positions`).

Cases are *in scope* when their nodes are in the default (``ai.onnx``) domain, their inputs and outputs are tensors
(not sequences, maps or optionals), and they are inference: not random generators (their outputs are draws) and not
training mode (``Dropout`` given ``training_mode=True``, ``BatchNormalization(training_mode=1)``). Each in-scope case
ends as *pass*, *wrong* (ran, different result), *unsupported* (refused at load by name: an operator or operator
version tfnet does not convert, :class:`~tfnet.onnx.UnsupportedOperatorError` or :class:`~tfnet.onnx.OpsetError`) or
*error* (anything else).

``python -m tfnet.onnx.conformance`` prints the figures and the failures.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from tfnet.errors import first_line

logger = logging.getLogger(__name__)

RANDOM_OPERATORS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli",
                              "Multinomial"})
OUTCOMES = ("pass", "wrong", "unsupported", "error")


@dataclass(frozen=True)
class CaseResult:
    name: str
    outcome: str  # one of OUTCOMES, or "out of scope"
    detail: str = ""


@dataclass
class Report:
    """Every case's result, with the counts and the pass rate of the in-scope ones."""

    results: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def counts(self) -> Counter:
        return Counter(r.outcome for r in self.results)

    @property
    def in_scope(self) -> int:
        return sum(self.counts[o] for o in OUTCOMES)

    @property
    def pass_rate(self) -> float:
        return self.counts["pass"] / max(self.in_scope, 1)

    def failures(self) -> list[CaseResult]:
        return [r for r in self.results if r.outcome in OUTCOMES[1:]]

    def out_of_scope(self) -> Counter:
        return Counter(r.detail for r in self.results if r.outcome == "out of scope")

    def summary(self) -> str:
        c = self.counts
        lines = [f"ONNX backend conformance (onnx {onnx_version()}): {c['pass']} of {self.in_scope} in-scope cases pass "
                 f"({100 * self.pass_rate:.1f}%): pass {c['pass']}, wrong {c['wrong']}, unsupported "
                 f"{c['unsupported']}, error {c['error']}; out of scope {c['out of scope']} "
                 f"({', '.join(f'{k}: {v}' for k, v in sorted(self.out_of_scope().items()))}); "
                 f"{self.seconds:.0f} s."]
        lines += [f"  {r.outcome:11s} {r.name}: {r.detail}" for r in self.failures()]
        return "\n".join(lines)


def onnx_version() -> str:
    import onnx

    return onnx.__version__


def scope_of(case) -> str | None:
    """Why ``case`` is out of scope, or None when it is in scope."""
    graph = case.model.graph
    if any(o.domain not in ("", "ai.onnx") for o in case.model.opset_import) or \
            any(n.domain not in ("", "ai.onnx") for n in graph.node):
        return "another domain"
    if any(not v.type.HasField("tensor_type") for v in list(graph.input) + list(graph.output)):
        return "non-tensor inputs or outputs"
    if any(n.op_type in RANDOM_OPERATORS for n in graph.node):
        return "random generator"
    if _training_mode(case):
        return "training mode"
    return None


def _training_mode(case) -> bool:
    from onnx import helper

    fed = {}
    for inputs, _ in case.data_sets:
        fed.update({i.name: v for i, v in zip(case.model.graph.input, inputs)})
    for n in case.model.graph.node:
        if n.op_type == "BatchNormalization" and any(
                a.name == "training_mode" and helper.get_attribute_value(a) for a in n.attribute):
            return True
        if n.op_type == "Dropout" and len(n.input) > 2 and n.input[2]:
            value = fed.get(n.input[2])
            if value is None or bool(np.asarray(value).reshape(-1)[0]):
                return True
    return False


def _array(value) -> np.ndarray:
    from onnx import TensorProto, numpy_helper

    from tfnet.onnx.dtypes import carrier_array

    return carrier_array(numpy_helper.to_array(value) if isinstance(value, TensorProto) else np.asarray(value))


def _initializer(value, name: str):
    from onnx import TensorProto, numpy_helper

    if isinstance(value, TensorProto):
        t = TensorProto()
        t.CopyFrom(value)
        t.name = name
        return t
    return numpy_helper.from_array(np.asarray(value), name)


def _expected_dtype(value) -> np.dtype:
    from onnx import TensorProto

    from tfnet.onnx.dtypes import tf_type

    if isinstance(value, TensorProto):
        return np.dtype(tf_type(value.data_type).as_numpy_dtype)
    return _array(value).dtype


def run_case(case) -> CaseResult:
    """Converts and runs one case (each of its data sets) and compares the outputs."""
    import onnx

    from tfnet import TFNet
    from tfnet.onnx.errors import OpsetError, UnsupportedOperatorError

    reason = scope_of(case)
    if reason:
        return CaseResult(case.name, "out of scope", reason)
    for k, (inputs, outputs) in enumerate(case.data_sets):
        model = onnx.ModelProto()
        model.CopyFrom(case.model)
        graph = model.graph
        names = [i.name for i in graph.input]
        for name, value in list(zip(names, inputs))[1:]:
            graph.initializer.append(_initializer(value, name))
        try:
            net = TFNet.from_onnx(model, relax_batch=False)
            feed = [_array(v) for v in inputs[:1]]
            got = net.forward(feed[0] if feed else [])
        except (UnsupportedOperatorError, OpsetError) as exc:
            return CaseResult(case.name, "unsupported", first_line(exc, 300))
        except Exception as exc:  # noqa: BLE001 - every other failure is the case's result
            return CaseResult(case.name, "error", f"{type(exc).__name__}: {first_line(exc, 300)}")
        got = got if isinstance(got, list) else [got]
        problem = compare_outputs(got, outputs, case.rtol, case.atol, defined_positions(case.model, inputs))
        if problem:
            return CaseResult(case.name, "wrong", problem if len(case.data_sets) == 1 else f"data set {k}: {problem}")
    return CaseResult(case.name, "pass")


def defined_positions(model, inputs: list) -> np.ndarray | None:
    """Where a case's first output is defined by the spec, for a float ``Cast`` or ``CastLike`` to a 2- or 4-bit
    integer: the positions whose input, truncated toward zero, is in the type's range (NaN and infinities are
    undefined too); None for every other case (all of it is compared).

    ONNX says only that a user "must be aware of ... value change caused by range difference" (Cast), and the
    implementations disagree outside the range: ml_dtypes 0.5 wraps around (as tfnet does,
    :mod:`tfnet.onnx.dtypes`), ml_dtypes 0.7 gives 0, onnxruntime 1.32 rounds to nearest and wraps. The cases'
    expected values are computed by ml_dtypes when onnx collects them, so they change with the ml_dtypes installed
    (onnx 1.23.2's own outputs for ``test_cast_FLOAT_to_UINT4`` went from wrapped to zeros with ml_dtypes 0.7.0)."""
    from tfnet.onnx.dtypes import narrow_int_range

    nodes = model.graph.node
    if len(nodes) != 1 or nodes[0].op_type not in ("Cast", "CastLike") or not inputs:
        return None
    target = narrow_int_range(model.graph.output[0].type.tensor_type.elem_type)
    x = _array(inputs[0])
    if target is None or x.dtype.kind != "f":
        return None
    lo, hi = target
    x = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        t = np.trunc(x)
        return np.isfinite(x) & (t >= lo) & (t <= hi)


def compare_outputs(got: list, want: list, rtol: float, atol: float, defined: np.ndarray | None = None) -> str:
    """``defined``: where the first output is compared (:func:`defined_positions`); None for all of it."""
    if len(got) != len(want):
        return f"{len(got)} outputs, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        dtype, w = _expected_dtype(w), _array(w)
        g = np.asarray(g)
        if w.dtype.kind in "OUS":  # strings: TensorFlow gives bytes
            g = np.vectorize(lambda b: b.decode() if isinstance(b, bytes) else b, otypes=[object])(g) if g.size else g
            if g.shape != w.shape or not np.array_equal(g.astype(str), w.astype(str)):
                return f"output {i}: strings differ"
            continue
        if g.dtype != dtype:
            return f"output {i} has dtype {g.dtype}, expected {dtype}"
        if g.shape != w.shape:
            return f"output {i} has shape {g.shape}, expected {w.shape}"
        if i == 0 and defined is not None:
            g, w = g[defined], w[defined]
        try:
            np.testing.assert_allclose(g.astype(np.float64) if g.dtype.kind == "f" else g,
                                       w.astype(np.float64) if w.dtype.kind == "f" else w, rtol=rtol, atol=atol)
        except AssertionError as exc:
            lines = [s.strip() for s in str(exc).splitlines() if "Max" in s]
            return f"output {i}: " + ("; ".join(lines) or "values differ")
    return ""


def collect(pattern: str | None = None) -> list:
    """onnx's node test cases (all, or those whose name contains ``pattern``)."""
    import warnings

    from onnx.backend.test.case import node

    with warnings.catch_warnings():  # the cases' own numpy references overflow on purpose
        warnings.simplefilter("ignore")
        cases = node.collect_testcases(None)
    return [c for c in cases if pattern is None or pattern in c.name]


def run_suite(cases: Iterable | None = None, *, optimize_graphs: bool = False, processes: int = 1) -> Report:
    """Runs every case (default: all of :func:`collect`) and returns the report.

    Args:
        cases: The cases. Default: onnx's whole node suite.
        optimize_graphs: Let TensorFlow's graph optimiser (grappler) run on each case's one-shot graph.
            Default False: it does not change what a graph computes, and each graph runs once.
        processes: With the default cases, share them among this many fresh processes (each imports
            TensorFlow once; the cases' order in the report stays the suite's). Default 1: this process.
    """
    if processes > 1 and cases is None:
        return _run_shared(processes, optimize_graphs)
    import tensorflow as tf

    cases = collect() if cases is None else list(cases)
    start = time.perf_counter()
    report = Report()
    previous = tf.config.optimizer.get_experimental_options()
    quiet = tf.get_logger().level
    tf.get_logger().setLevel(logging.ERROR)  # each case's net traces its own function: no retracing warnings
    if not optimize_graphs:
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    try:
        for case in cases:
            report.results.append(run_case(case))
    finally:
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": previous.get("disable_meta_optimizer",
                                                                                              False)})
        tf.get_logger().setLevel(quiet)
    report.seconds = time.perf_counter() - start
    return report


def _run_cases(cases: list, optimize_graphs: bool) -> list[CaseResult]:
    """A share of the cases (in a process of :func:`_run_shared`)."""
    return run_suite(cases, optimize_graphs=optimize_graphs).results


def _run_shared(processes: int, optimize_graphs: bool) -> Report:
    """The suite's cases collected once, here (onnx computes every case's reference outputs: 10 CPU-s), while the
    fresh processes import TensorFlow; each process then runs every ``processes``-th case."""
    start = time.perf_counter()
    results = in_processes(_run_cases, processes, collect, optimize_graphs)
    return Report(results=results, seconds=time.perf_counter() - start)


def _import_tensorflow() -> None:
    import tensorflow  # noqa: F401 - a pool process's start-up, while the parent collects


def in_processes(share, processes: int, items, *args) -> list:
    """``share(items()[index::processes], *args)`` (a module-level function returning one result per item) in each
    of ``processes`` fresh spawned processes (TensorFlow does not fork); ``items`` is called here while the processes
    start and import TensorFlow. The results are put back in the items' order."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_import_tensorflow) as pool:
        started = [pool.submit(int) for _ in range(processes)]  # the processes start now
        everything = list(items())
        for future in started:
            future.result()
        shares = list(pool.map(share, [everything[i::processes] for i in range(processes)],
                               *([a] * processes for a in args)))
    results = [None] * sum(len(s) for s in shares)
    for index, part in enumerate(shares):
        results[index::processes] = part
    return results


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Runs onnx's backend node tests through tfnet.")
    parser.add_argument("pattern", nargs="?", default=None, help="only the cases whose name contains this")
    args = parser.parse_args(argv)
    report = run_suite(collect(args.pattern))
    print(report.summary())  # noqa: T201 - the command's output


if __name__ == "__main__":
    main()
