"""Where a run's CPU goes, process by process: every 0.5 s, each process's CPU-seconds, its command line (as first
seen) and the test it was started under (``PYTEST_CURRENT_TEST`` in its environment: pytest sets it around each
phase, and what a test starts inherits it); then a report by kind of process and by test module. Linux (``/proc``),
as root to read every process's environment::

    python scripts/cpu_by_process.py sample OUT.json &     # until OUT.json.stop exists
    CI=true make test; touch OUT.json.stop
    python scripts/cpu_by_process.py report OUT.json

What it cannot see: processes that lived less than one sweep (0.5 s), and the test of what a process forked without
exec (its environment is its parent's at exec: a pytest worker's own tests count as the worker), and which tests
used a process a fixture shares (a session's JVM counts under the test that first asked for it). Processes already
running at the first sweep count only their CPU after it. A JVM started by Spark's scripts keeps the command line
of the ``bash`` that exec'd it (``spark-class``)."""

from __future__ import annotations

import collections
import json
import os
import sys
import time

SWEEP_S = 0.5


def _sample(out: str) -> None:
    seen: dict[str, dict] = {}
    tick, me, first = os.sysconf("SC_CLK_TCK"), os.getpid(), True
    while not os.path.exists(out + ".stop"):
        for pid in filter(str.isdigit, os.listdir("/proc")):
            if int(pid) == me:
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
                fields = stat[stat.rindex(")") + 2:].split()
                cpu = (int(fields[11]) + int(fields[12])) / tick
                key = f"{pid}:{fields[19]}"  # pid and start time: a reused pid is another process
                if key in seen:
                    seen[key]["cpu"] = cpu
                    continue
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:300]
                seen[key] = {"ppid": int(fields[1]), "cmd": cmd, "test": _test_of(pid), "cpu": cpu,
                             "base": cpu if first else 0.0}
            except (OSError, ValueError, IndexError):  # ended between the listing and the read
                pass
        first = False
        time.sleep(SWEEP_S)
    with open(out, "w") as f:
        json.dump(seen, f)


def _test_of(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for entry in f.read().split(b"\0"):
                if entry.startswith(b"PYTEST_CURRENT_TEST="):
                    return entry.split(b"=", 1)[1].decode(errors="replace")
    except OSError:
        pass
    return ""


def kind(cmd: str) -> str:
    """What a process is, from its command line."""
    argv0 = cmd.split(" ")[0]
    if os.path.basename(argv0) == "java" or "spark-class" in cmd or "tfnet-entrypoint" in cmd or "entrypoint.sh" in cmd:
        return "JVM (Spark driver, executor, master, worker, Connect server)"
    if " -m optim.spark.worker_daemon" in cmd or " -m pyspark.daemon" in cmd:
        return "Spark's Python workers (daemons and their forks)"
    if "import sys;exec(eval(sys.stdin.readline()))" in cmd:
        return "pytest-xdist workers (in-process tests)"
    if "multiprocessing.spawn" in cmd:
        return "Python pools (multiprocessing spawn)"
    if os.path.basename(argv0).startswith("python"):
        return "other Python programs"
    return "other: " + os.path.basename(argv0)[:30]


def _daemons(seen: dict[str, dict]) -> list[float]:
    """The CPU of each Spark Python worker daemon: a worker process whose parent is not one (the forks' parent is)."""
    workers = kind("python -m pyspark.daemon pyspark.worker")
    parents = {key.split(":")[0]: proc["cmd"] for key, proc in seen.items()}
    return [proc["cpu"] - proc["base"] for proc in seen.values()
            if kind(proc["cmd"]) == workers and kind(parents.get(str(proc["ppid"]), "")) != workers]


def report(path: str, top: int = 30) -> str:
    with open(path) as f:
        seen = json.load(f)
    by_kind, by_module = collections.Counter(), collections.Counter()
    count, within = collections.Counter(), collections.defaultdict(collections.Counter)
    for proc in seen.values():
        cpu, what = proc["cpu"] - proc["base"], kind(proc["cmd"])
        module = proc["test"].split("::")[0] or "(no test in its environment)"
        by_kind[what] += cpu
        count[what] += 1
        by_module[module] += cpu
        within[module][what] += cpu
    total = sum(by_kind.values())
    lines = [f"{len(seen)} processes, {total:.0f} CPU-s", "by kind:"]
    lines += [f"  {cpu:8.1f} {100 * cpu / total:4.1f}% {count[k]:5d} {k}" for k, cpu in by_kind.most_common(8)]
    daemons = _daemons(seen)
    lines.append(f"  (of Spark's Python workers, {len(daemons)} daemons: {sum(daemons):.0f} CPU-s; the rest their forks)")
    lines.append("by the test module that started them:")
    for module, cpu in by_module.most_common(top):
        parts = ", ".join(f"{k.split(' (')[0]} {v:.0f}" for k, v in within[module].most_common(3))
        lines.append(f"  {cpu:8.1f} {module}  ({parts})")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("sample", "report"):
        sys.exit(__doc__)
    if sys.argv[1] == "sample":
        _sample(sys.argv[2])
    else:
        print(report(sys.argv[2]))
