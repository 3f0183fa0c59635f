"""``import tfnet`` makes the interpreter's exit skip tearing down what is still alive (tfnet.fast_exit): a user's
program, in a fresh interpreter, exits with its status, its buffered output and its own ``atexit`` handler as before;
garbage left at exit is still finalized; only a live object in a reference cycle keeps its ``__del__`` from running,
which ``TFNET_FAST_EXIT=0`` brings back. Both programs start side by side as the module begins."""

import os
import sys

import pytest

from tests.side_by_side import SideBySide

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROGRAM = """
import atexit, gc, os, sys
import tfnet

class InACycle:
    def __init__(self, word):
        self.word, self.me = word, self
    def __del__(self, write=os.write):  # os.write bound now: the module may be cleared when this runs
        write(1, f"finalized {self.word}\\n".encode())

live = InACycle("live")
gc.disable()  # the garbage below waits for a collection: the exit's
InACycle("garbage")
atexit.register(lambda: os.write(1, b"user atexit\\n"))
print("buffered", end="")  # no newline, no flush: written at exit
sys.exit(3)
"""


@pytest.fixture(scope="module")
def exits(tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONUNBUFFERED", "TFNET_FAST_EXIT")}
    env.update(PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    runs = SideBySide()
    for name, extra in (("default", {}), ("off", {"TFNET_FAST_EXIT": "0"})):
        runs.start(name, [sys.executable, "-c", PROGRAM], timeout=300, env=dict(env, **extra),
                   cwd=str(tmp_path_factory.mktemp("exit")))
    yield runs
    runs.close()


def test_the_exit_keeps_status_output_handlers_and_garbage_finalizers_but_not_live_cycles(exits):
    proc = exits.result("default")
    assert proc.returncode == 3, proc.stderr
    assert "buffered" in proc.stdout and "user atexit" in proc.stdout and "finalized garbage" in proc.stdout, proc.stdout
    assert "finalized live" not in proc.stdout, proc.stdout  # frozen: not torn down
    assert proc.stderr.strip() == "", proc.stderr


def test_tfnet_fast_exit_0_tears_everything_down_as_without_tfnet(exits):
    proc = exits.result("off")
    assert proc.returncode == 3, proc.stderr
    for line in ("buffered", "user atexit", "finalized garbage", "finalized live"):
        assert line in proc.stdout, (line, proc.stdout)
    assert proc.stderr.strip() == "", proc.stderr
