"""Writes the list of ONNX conformance cases that pass through tfnet (issue 42), one name a line, for
``tests/tfnet/test_onnx_conformance.py``, which fails naming any listed case that stops passing::

    .venv/bin/python scripts/onnx_conformance_passing.py            # tests/fixtures/onnx_conformance_passing.txt

Run it after a change that makes more cases pass (the test prints those it finds passing beyond the list),
and commit the list with the change. The header names the onnx version the list was made with: the test
compares only under that version.
"""

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "tests", "fixtures", "onnx_conformance_passing.txt")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=DEFAULT)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args(argv)
    sys.path.insert(0, ROOT)
    import onnx

    from tfnet.onnx.conformance import run_suite

    report = run_suite(processes=args.processes)
    passing = sorted(r.name for r in report.results if r.outcome == "pass")
    with open(args.out, "w") as f:
        f.write(f"# onnx {onnx.__version__}: {len(passing)} of {report.in_scope} in-scope cases pass through tfnet.\n")
        f.write("# Made by scripts/onnx_conformance_passing.py; one case name a line.\n")
        f.write("\n".join(passing) + "\n")
    print(f"{len(passing)} passing cases -> {args.out}")  # noqa: T201 - the script's output


if __name__ == "__main__":
    main()
