"""Writes the list of ONNX backend model cases that do not pass through tfnet (issue 54), one a line with its
reason, for ``tests/tfnet/test_onnx_model_suite.py``, which fails on any other case that does not pass and on
any listed case that passes::

    .venv/bin/python scripts/onnx_model_suite_known.py            # tests/fixtures/onnx_model_suite_known.txt

A case listed before keeps the reason written for it; a new one gets its outcome and the first words of its
error, to be edited into a reason. The header names the onnx version the list was made with: the test
compares only under that version.
"""

import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "tests", "fixtures", "onnx_model_suite_known.txt")


def reason_of(result) -> str:
    """A first reason for a failing case: the operators refused, else the outcome and its error."""
    found = re.search(r"cannot convert: (.*?) \(vN", result.detail)
    if result.outcome == "unsupported" and found:
        return "unsupported: " + re.sub(r" \(x\d+\)", "", found.group(1))
    return f"{result.outcome}: {result.detail[:120]}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=DEFAULT)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args(argv)
    sys.path.insert(0, ROOT)
    import onnx

    from tfnet.onnx.model_suite import read_known, run_suite

    old = read_known(args.out)
    report = run_suite(processes=args.processes)
    failing = sorted(report.failures(), key=lambda r: r.name)
    width = max((len(r.name) for r in failing), default=0) + 2
    with open(args.out, "w") as f:
        f.write(f"# onnx {onnx.__version__}: {report.counts['pass']} of {report.in_scope} in-scope model cases pass "
                "through tfnet; these do not.\n")
        f.write("# Made by scripts/onnx_model_suite_known.py; one case a line: folder/case, then why.\n")
        f.writelines(f"{r.name:{width}s}{old.get(r.name) or reason_of(r)}\n" for r in failing)
    print(report.summary())  # noqa: T201 - the script's output
    print(f"{len(failing)} known failures -> {args.out}")  # noqa: T201


if __name__ == "__main__":
    main()
