"""README.md's examples run as written: every ```python block, in order, in one namespace (as a
user pastes them into one session), in a fresh process started in an empty folder: no set-up, no
fixture. The README makes its own inputs (a frozen graph and a DataFrame from scikit-learn's digits,
an ONNX file written with the ``onnx`` package, PNG files cut from scikit-learn's sample photos) and
its own ``SparkSession``. ```bash blocks are not run. A block that cannot run here is marked right
above its fence with ``<!-- readme-test: skip (the reason) -->``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SKIP = re.compile(r"^<!--\s*readme-test:\s*skip\s*\((?P<reason>[^)]+)\)\s*-->\s*$")
#: At most this many blocks may be skipped; each needs a reason.
MAX_SKIPPED = 2


class Block(NamedTuple):
    line: int  # the README line of the block's first code line (1-based)
    lang: str
    code: str
    skip: str | None  # the reason, when marked


def blocks(text: str) -> list[Block]:
    """The fenced code blocks of ``text``, with the skip marker of the line above each, if any."""
    out: list[Block] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        above = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = SKIP.match(above.strip())
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        out.append(Block(i + 2, fence.group(1), "\n".join(lines[i + 1:end]), marker["reason"] if marker else None))
        i = end + 1
    return out


def python_blocks() -> list[Block]:
    return [b for b in blocks(README.read_text()) if b.lang == "python"]


def test_the_readme_blocks_are_python_or_bash_and_few_are_skipped():
    every = blocks(README.read_text())
    assert {b.lang for b in every} <= {"python", "bash"}, [(b.line, b.lang) for b in every]
    code = python_blocks()
    assert len(code) >= 10
    skipped = [b for b in code if b.skip]
    assert len(skipped) <= MAX_SKIPPED, [(b.line, b.skip) for b in skipped]
    assert all(len(b.skip.strip()) > 10 for b in skipped), "each skip says why"
    for b in code:
        compile(b.code, f"README.md:{b.line}", "exec")  # at least valid Python, skipped or not
    stray = [n for n, line in enumerate(README.read_text().split("\n"), 1)
             if line.startswith("<!--") and "readme-test" in line and not SKIP.match(line)]
    assert not stray, f"malformed readme-test markers on lines {stray}"


#: What the README says of its results, checked after its last block (expressions in its namespace).
CHECKS = {
    "weight names": 'net.weight_names[:2] == ["digits/conv/kernel", "digits/conv/bias"]',
    "ONNX initializer names": 'resnet.weight_names[:3] == ["conv1.weight", "bn1.weight", "bn1.bias"]',
    "ONNX statistics": 'resnet.statistic_names[:2] == ["bn1.running_mean", "bn1.running_var"]',
    "the digits net learns (ln 10 = 2.3 at chance)": 'len(history["loss"]) == 5 and history["loss"][-1] < 0.5',
    "predict equals forward": "bool(np.allclose(logits, opt.net.forward(x), atol=1e-5))",
    "the bad row's error": "'pixels' in message and 'partition' in message and '63' in message",
    "the images the README wrote were read": "photos.count() == 48",
    "the best model carries the rate the search chose, saved and loaded": 'best.getOrDefault("learningRate") in '
        '(1e-3, 1e-2) and PipelineModel.load("best").stages[-1].getOrDefault("learningRate") == best.getLearningRate()',
}


def run_readme(out: str) -> None:
    """Runs README.md's python blocks in order in one namespace (in this process, whose working
    folder is the example's), timing each, then evaluates :data:`CHECKS`; writes the results to
    ``out`` as JSON."""
    import json
    import sys
    import time

    namespace: dict = {"__name__": "__main__"}
    report: dict = {"blocks": [], "checks": {}}
    for block in python_blocks():
        if block.skip:
            continue
        t0 = time.monotonic()
        # padded so that a traceback names the README's own line numbers
        exec(compile("\n" * (block.line - 1) + block.code, str(README), "exec"), namespace)  # noqa: S102
        report["blocks"].append([block.line, round(time.monotonic() - t0, 1)])
        print(f"README block at line {block.line}: {report['blocks'][-1][1]} s", file=sys.stderr, flush=True)
    for name, expression in CHECKS.items():
        report["checks"][name] = bool(eval(expression, namespace))  # noqa: S307
    with open(out, "w") as f:
        json.dump(report, f)


@pytest.mark.spark
@pytest.mark.parallel
def test_every_python_block_of_the_readme_runs_in_order(tmp_path):
    """In a fresh process and an empty folder, as a user runs them: the README makes its own inputs and
    SparkSession."""
    import json
    import os
    import subprocess
    import sys

    folder = tmp_path / "empty"
    folder.mkdir()
    report = tmp_path / "report.json"  # outside the user's folder
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               PYSPARK_PYTHON=sys.executable)
    env.pop("TFNET_VERBOSE", None)
    proc = subprocess.run([sys.executable, "-c", f"from tests.test_readme import run_readme; run_readme({str(report)!r})"],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    result = json.loads(report.read_text())
    ran = [line for line, _ in result["blocks"]]
    assert ran == [b.line for b in python_blocks() if not b.skip]
    assert all(result["checks"].values()), result["checks"]
