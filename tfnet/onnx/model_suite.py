"""ONNX's own model-level backend tests, run through tfnet.

The ``onnx`` wheel ships model folders under ``onnx/backend/test/data/``: ``pytorch-converted``,
``pytorch-operator`` and ``simple`` (each a ``model.onnx`` with ``test_data_set_*/input_*.pb`` and
``output_*.pb``), and the nine networks of ``light`` (``light_*.onnx`` with ``light_*_output_0.pb``),
whose inputs onnx's runner makes (``Runner.generate_dummy_data(x, seed=0, random=False)``: ``arange(n) / n``
in the input's shape) and whose tolerances ``real/*/data.json`` holds. Each case is loaded with
``TFNet.from_onnx`` (defaults: what a user gets, old opsets upgraded on the way) and run with
``forward``, every data set, and its outputs compared as onnx's runner compares them (same dtype and shape,
``np.testing.assert_allclose`` with the case's ``rtol`` and ``atol``: 1e-3 and 1e-7 unless the case says).

Out of scope: the training domain (``ai.onnx.preview.training``, ``Gradient``). Each in-scope case ends as
*pass*, *wrong*, *unsupported* or *error*, as in :mod:`tfnet.onnx.conformance`, with its seconds.

``python -m tfnet.onnx.model_suite`` prints the counts by folder and the failures.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass

from tfnet.errors import first_line
from tfnet.onnx import conformance
from tfnet.onnx.conformance import OUTCOMES, compare_outputs, onnx_version

FOLDERS = ("pytorch-converted", "pytorch-operator", "simple", "light")
DEFAULT_RTOL, DEFAULT_ATOL = 1e-3, 1e-7  # onnx.backend.test.loader's defaults
TRAINING_DOMAINS = ("ai.onnx.preview.training",)


@dataclass(frozen=True)
class ModelCase:
    """One model folder (or ``light`` network): where its model is and how to compare."""

    name: str  # "folder/test_name"
    model_path: str
    data_dirs: tuple[str, ...]  # test_data_set_* folders; empty for a light network
    expected: tuple[str, ...] = ()  # a light network's light_*_output_*.pb
    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL

    @property
    def folder(self) -> str:
        return self.name.split("/")[0]


@dataclass(frozen=True)
class ModelResult:
    name: str
    outcome: str  # one of OUTCOMES, or "out of scope"
    detail: str = ""
    seconds: float = 0.0  # wall-clock: load, convert and forward every data set
    cpu_seconds: float = 0.0  # the process's CPU time over the same (every thread): what the case costs, whatever else runs

    @property
    def folder(self) -> str:
        return self.name.split("/")[0]


class Report(conformance.Report):
    """Every case's result (:class:`ModelResult`), with counts by folder."""

    def by_folder(self) -> dict[str, Counter]:
        out: dict[str, Counter] = {f: Counter() for f in FOLDERS}
        for r in self.results:
            out.setdefault(r.folder, Counter())[r.outcome] += 1
        return out

    def slowest(self) -> ModelResult | None:
        return max(self.results, key=lambda r: r.seconds, default=None)

    def summary(self) -> str:
        c = self.counts
        slow = self.slowest()
        lines = [f"ONNX backend model tests (onnx {onnx_version()}): {c['pass']} of {self.in_scope} in-scope cases "
                 f"pass ({100 * self.pass_rate:.1f}%); out of scope {c['out of scope']} (training domain); "
                 f"{self.seconds:.0f} s" + (f"; slowest {slow.name}: {slow.seconds:.1f} s, {slow.cpu_seconds:.1f} s of "
                                            "CPU." if slow else ".")]
        for folder, counts in self.by_folder().items():
            n = sum(counts[o] for o in OUTCOMES)
            lines.append(f"  {folder:18s} {counts['pass']:3d} of {n:3d} pass; " + ", ".join(
                f"{o} {counts[o]}" for o in OUTCOMES[1:] if counts[o]))
        lines += [f"  {r.outcome:11s} {r.name}: {r.detail}" for r in self.failures()]
        return "\n".join(lines)


def data_dir() -> str:
    import onnx.backend.test

    return os.path.join(os.path.dirname(onnx.backend.test.__file__), "data")


def collect(pattern: str | None = None) -> list[ModelCase]:
    """Every model case of the installed onnx (or those whose ``folder/name`` contains ``pattern``), sorted."""
    root = data_dir()
    cases = []
    for folder in FOLDERS[:3]:
        for test in sorted(os.listdir(os.path.join(root, folder))):
            case_dir = os.path.join(root, folder, test)
            if not os.path.isfile(os.path.join(case_dir, "model.onnx")):
                continue
            rtol, atol = _tolerances(os.path.join(case_dir, "data.json"))
            cases.append(ModelCase(f"{folder}/{test}", os.path.join(case_dir, "model.onnx"),
                                   tuple(sorted(glob.glob(os.path.join(case_dir, "test_data_set*")))),
                                   rtol=rtol, atol=atol))
    for test in sorted(os.listdir(os.path.join(root, "real"))):
        data_json = os.path.join(root, "real", test, "data.json")
        if not os.path.isfile(data_json):
            continue
        with open(data_json) as f:
            url = json.load(f)["url"]  # "onnx/backend/test/data/light/light_*.onnx"
        path = os.path.join(root, "light", os.path.basename(url))
        prefix = os.path.splitext(path)[0]
        rtol, atol = _tolerances(data_json)
        cases.append(ModelCase(f"light/{test}", path, (), tuple(sorted(glob.glob(prefix + "_output_*.pb"))),
                               rtol=rtol, atol=atol))
    return [c for c in cases if pattern is None or pattern in c.name]


def _tolerances(data_json: str) -> tuple[float, float]:
    if not os.path.isfile(data_json):
        return DEFAULT_RTOL, DEFAULT_ATOL
    with open(data_json) as f:
        data = json.load(f)
    return float(data.get("rtol", DEFAULT_RTOL)), float(data.get("atol", DEFAULT_ATOL))


def _read(path: str, type_proto):
    """A ``.pb`` value as onnx's runner reads it: a tensor as an array, a sequence as a list of arrays."""
    import onnx
    from onnx import numpy_helper

    with open(path, "rb") as f:
        data = f.read()
    if type_proto is not None and type_proto.HasField("sequence_type"):
        seq = onnx.SequenceProto()
        seq.ParseFromString(data)
        return numpy_helper.to_list(seq)
    t = onnx.TensorProto()
    t.ParseFromString(data)
    return numpy_helper.to_array(t)


def data_sets(case: ModelCase, model) -> list[tuple[list, list]]:
    """``[(inputs, expected outputs)]`` of ``case``: its ``.pb`` files, or for a ``light`` network the
    inputs onnx's runner makes and the outputs shipped beside the model."""
    from onnx.backend.test.runner import Runner

    graph = model.graph
    if not case.data_dirs:
        inits = {t.name for t in graph.initializer}
        inputs = [Runner.generate_dummy_data(x, seed=0, random=False) for x in graph.input if x.name not in inits]
        return [(inputs, [_read(p, None) for p in case.expected])]
    out = []
    for d in case.data_dirs:
        n_in = len(glob.glob(os.path.join(d, "input_*.pb")))
        n_out = len(glob.glob(os.path.join(d, "output_*.pb")))
        inputs = [_read(os.path.join(d, f"input_{i}.pb"), graph.input[i].type) for i in range(n_in)]
        outputs = [_read(os.path.join(d, f"output_{i}.pb"), graph.output[i].type) for i in range(n_out)]
        out.append((inputs, outputs))
    return out


def scope_of(model) -> str | None:
    """Why ``model`` is out of scope, or None."""
    domains = {o.domain for o in model.opset_import} | {n.domain for n in model.graph.node}
    if domains & set(TRAINING_DOMAINS):
        return "training domain"
    return None


def run_case(case: ModelCase) -> ModelResult:
    """Loads, converts and runs one case (each of its data sets) and compares the outputs."""
    import onnx

    from tfnet import TFNet
    from tfnet.onnx.errors import OpsetError, UnsupportedOperatorError

    start, cpu = time.perf_counter(), time.process_time()

    def result(outcome: str, detail: str = "") -> ModelResult:
        return ModelResult(case.name, outcome, detail, time.perf_counter() - start, time.process_time() - cpu)

    model = onnx.load(case.model_path)
    reason = scope_of(model)
    if reason:
        return result("out of scope", reason)
    sets = data_sets(case, model)
    try:
        net = TFNet.from_onnx(case.model_path)
    except (UnsupportedOperatorError, OpsetError) as exc:
        return result("unsupported", first_line(exc, 300))
    except Exception as exc:  # noqa: BLE001 - every other failure is the case's result
        return result("error", f"{type(exc).__name__}: {first_line(exc, 300)}")
    for k, (inputs, outputs) in enumerate(sets):
        try:
            got = net.forward(list(inputs))
        except Exception as exc:  # noqa: BLE001
            return result("error", f"{type(exc).__name__}: {first_line(exc, 300)}")
        got = got if isinstance(got, list) else [got]
        problem = compare_outputs(got, outputs, case.rtol, case.atol)
        if problem:
            return result("wrong", problem if len(sets) == 1 else f"data set {k}: {problem}")
    return result("pass")


def run_suite(cases: list[ModelCase] | None = None, *, processes: int = 1) -> Report:
    """Runs every case (default: all of :func:`collect`) and returns the report.

    Args:
        cases: The cases. Default: every model case of the installed onnx.
        processes: With the default cases, share them among this many fresh processes (each imports
            TensorFlow once). Default 1: this process.
    """
    if processes > 1 and cases is None:
        return _run_shared(processes)
    import tensorflow as tf

    cases = collect() if cases is None else list(cases)
    start = time.perf_counter()
    report = Report()
    quiet = tf.get_logger().level
    tf.get_logger().setLevel(logging.ERROR)  # each case's net traces its own function: no retracing warnings
    try:
        for case in cases:
            report.results.append(run_case(case))
    finally:
        tf.get_logger().setLevel(quiet)
    report.seconds = time.perf_counter() - start
    return report


def _run_cases(cases: list[ModelCase]) -> list[ModelResult]:
    return run_suite(cases).results


def _run_shared(processes: int) -> Report:
    start = time.perf_counter()
    results = conformance.in_processes(_run_cases, processes, collect)
    return Report(results=results, seconds=time.perf_counter() - start)


def read_known(path: str) -> dict[str, str]:
    """``{folder/case: reason}`` from a list of known failures (``scripts/onnx_model_suite_known.py`` writes one:
    a case a line, its name then its reason; ``#`` lines are comments)."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        rows = [line.split(None, 1) for line in f.read().splitlines() if line.strip() and not line.startswith("#")]
    return {row[0]: row[1].strip() if len(row) > 1 else "" for row in rows}


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Runs onnx's backend model tests through tfnet.")
    parser.add_argument("pattern", nargs="?", default=None, help="only the cases whose folder/name contains this")
    parser.add_argument("--processes", type=int, default=1)
    args = parser.parse_args(argv)
    report = run_suite(collect(args.pattern)) if args.pattern or args.processes == 1 else \
        run_suite(processes=args.processes)
    print(report.summary())  # noqa: T201 - the command's output
    for r in sorted(report.results, key=lambda r: -r.seconds)[:5]:
        print(f"  {r.seconds:6.1f} s ({r.cpu_seconds:5.1f} s of CPU) {r.name}")  # noqa: T201


if __name__ == "__main__":
    main()
