"""What a user's console shows around each DataFrame action (issue 56), read from a driver's output: the driver
prints ``<<ACTION label>>`` before each action, then ``label -> <result>``; ``<<ACTIONS END>>`` after the last one,
then stops Spark and prints ``<<STOPPED>>``."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def user_env(**extra: str) -> dict:
    """The environment of a user's own PySpark program: tfnet's source on the path, the workers' Python set (the
    user's own setting, as for any PySpark job with a venv), and none of the test process's Spark gateway, Connect or
    tfnet verbosity settings; then ``extra``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
               PYSPARK_PYTHON=sys.executable)
    for key in ("TFNET_VERBOSE", "PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "SPARK_REMOTE"):
        env.pop(key, None)
    env.update(extra)
    return env


# Spark's own line when an executor's disconnect reaches the driver while SparkContext.stop() runs on a standalone
# cluster (StandaloneSchedulerBackend.StandaloneDriverEndpoint.onDisconnected, in pyspark 4's spark-core jar): a race
# inside Spark's stop that a plain PySpark job on a standalone cluster meets too (ci91c: once in 1,074 tests)
SPARK_STOP_RACE = re.compile(r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d WARN StandaloneSchedulerBackend\$StandaloneDriverEndpoint: "
                             r"Skipping onDisconnected RemoveExecutor call because the scheduler is stopping$")


def assert_each_action_printed_its_own_output(out: str, actions: int) -> None:
    """Each of the ``actions`` sections holds its own result line (and, for ``show``, its table) and nothing else,
    Spark's own stage bar aside (a plain PySpark job shows it too); nothing follows ``spark.stop()``."""
    sections = out.split("<<ACTIONS END>>")[0].split("<<ACTION ")[1:]
    assert len(sections) == actions, out[-3000:]
    for section in sections:
        head, *body = [line for line in section.replace("\r", "\n").split("\n")
                       if line.strip() and not line.startswith("[Stage ")]
        label = head.rstrip(">")
        name = label.split(" ")[-1]
        mine = [line for line in body if line.startswith(f"{label} -> ")]
        table = [line for line in body if name == "show" and (line[:1] in "+|" or line == "only showing top 2 rows")]
        stray = [line for line in body if line not in mine + table]
        assert name != "show" or len(table) == 7, body  # three rules, the header, 2 rows and the footer
        assert len(mine) == 1 and not stray, (label, body)
    stopped = out.split("<<ACTIONS END>>")[1]
    assert [line for line in stopped.strip().split("\n") if not SPARK_STOP_RACE.match(line)] == ["<<STOPPED>>"], \
        stopped[-2000:]


class Program:
    """A user's program, ``python -c source`` (``-u``: unbuffered) in a process of its own started in ``cwd``: its
    stdout and stderr each to a file of ``folder``, or with ``merged`` both, in the order printed, to one
    (``console.log``); :meth:`result` waits for it."""

    def __init__(self, source: str, folder, env: dict, *, merged: bool = False, unbuffered: bool = False, cwd=None):
        self.out = folder / ("console.log" if merged else "stdout")
        self.err = None if merged else folder / "stderr"
        with open(self.out, "wb") as out, open(self.err or os.devnull, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, *(["-u"] if unbuffered else []), "-c", source], cwd=cwd,
                                         env=env, stdin=subprocess.DEVNULL, stdout=out,
                                         stderr=subprocess.STDOUT if merged else err)

    def result(self, timeout: float) -> tuple[int, str, str]:
        """``(exit status, stdout, stderr)`` read as text pipes would be (universal newlines; stderr "" when merged);
        a program still running after ``timeout`` seconds is killed."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"not done within {timeout} s:\n{_text(self.err or self.out)[-4000:]}")
        return self.proc.returncode, _text(self.out), _text(self.err) if self.err else ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _text(path) -> str:
    return path.read_bytes().decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n")
