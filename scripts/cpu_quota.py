"""Runs a command as a slower machine would: every process it starts shares a CPU quota of a given number of cores
(a cgroup's CFS bandwidth limit), so the suite's timing races widen and its time can be read against the quota.

    python scripts/cpu_quota.py --cores 1.2 -- env CI=true bash .ci/run

On a 2-core machine, ``--cores 1.2`` gives the command 60% of it: about what a CPU 1.7x slower gives (the issue's
AMD Zen 3 took 1.6-2x a Zen 4's or Zen 5's time on the same suite). It is not a model of that CPU: a quota runs the
processes at full speed and then stops them until the next period (100 ms), and what runs outside the command's
group (Docker's containers, which dockerd places in its own groups) is not slowed. When the command ends it prints
its wall time and how often the group was throttled, and exits with the command's status.

Linux, as root: cgroup v2 (``cpu.max``) where the ``cpu`` controller is on the unified hierarchy, else cgroup v1's
``cpu`` hierarchy (``cpu.cfs_quota_us``). Stdlib only."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

PERIOD_US = 100_000


class QuotaError(RuntimeError):
    """No cgroup with a writable ``cpu`` controller here."""


def _cpu_hierarchy() -> tuple[str, int]:
    """The mount point of the hierarchy that holds the ``cpu`` controller, and its cgroup version."""
    with open("/proc/self/mounts") as f:
        mounts = [line.split() for line in f]
    for _, where, kind, *_ in mounts:
        if kind == "cgroup2":
            try:
                with open(os.path.join(where, "cgroup.controllers")) as c:
                    if "cpu" in c.read().split():
                        return where, 2
            except OSError:
                continue
    for _, where, kind, options, *_ in mounts:
        if kind == "cgroup" and "cpu" in options.split(","):
            return where, 1
    raise QuotaError("no cgroup hierarchy with the cpu controller is mounted (/proc/self/mounts)")


class Group:
    """A fresh cgroup limited to ``cores`` cores; removed by :meth:`close`."""

    def __init__(self, cores: float):
        if not 0.01 <= cores <= os.cpu_count():
            raise QuotaError(f"--cores {cores}: give a number from 0.01 to this machine's {os.cpu_count()} cores")
        root, self.version = _cpu_hierarchy()
        self.path = os.path.join(root, f"tfnet-cpu-quota-{os.getpid()}")
        quota = round(cores * PERIOD_US)
        try:
            if self.version == 2:
                with open(os.path.join(root, "cgroup.subtree_control"), "w") as f:
                    f.write("+cpu")
                os.mkdir(self.path)
                self._write("cpu.max", f"{quota} {PERIOD_US}")
            else:
                os.mkdir(self.path)
                self._write("cpu.cfs_period_us", str(PERIOD_US))
                self._write("cpu.cfs_quota_us", str(quota))
        except OSError as exc:
            self.close()
            raise QuotaError(f"cannot make a cgroup with a CPU quota at {self.path} ({exc.strerror}): "
                             f"run as root on a machine whose cgroup cpu controller is writable") from None

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)

    def join(self, pid: int) -> None:
        self._write("cgroup.procs", str(pid))

    def stat(self) -> dict[str, int]:
        """``cpu.stat``: ``nr_periods`` and ``nr_throttled`` among others."""
        with open(os.path.join(self.path, "cpu.stat")) as f:
            return {k: int(v) for k, v in (line.split() for line in f if line.strip())}

    def close(self) -> None:
        """Removes the group; one that still holds a process (a daemon the command left running) stays, said so."""
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            print(f"cpu_quota: {self.path} left in place ({exc.strerror}: a process the command started still runs)",
                  file=sys.stderr)


def run(cores: float, command: list[str]) -> int:
    """Runs ``command`` in a fresh group of ``cores`` cores and returns its status. The group's processes are the
    command's: the child joins the group before it execs (``preexec_fn``), so nothing it starts is outside it."""
    group = Group(cores)
    start = time.monotonic()
    interrupt = signal.getsignal(signal.SIGINT)

    def in_group() -> None:  # in the child, before it execs
        group.join(os.getpid())
        if interrupt is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.SIG_DFL)  # as the command would have it without this script

    # Ctrl-C reaches the command too (one process group), and its end is the answer: this script ignores it while it
    # waits, as a shell does. A KeyboardInterrupt raised here could land just after waitpid had reaped the command, and
    # its status would be lost (Popen then reads 0 for a command that SIGINT ended).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        child = subprocess.Popen(command, preexec_fn=in_group)
        status = child.wait()
        stat = group.stat()
        wall = time.monotonic() - start
        throttled = f"throttled in {stat.get('nr_throttled', 0)} of {stat.get('nr_periods', 0)} periods"
        print(f"cpu_quota: {cores:g} of {os.cpu_count()} cores for {wall:.0f} s: {throttled} (cgroup v{group.version})",
              file=sys.stderr)
        return status if status >= 0 else 128 - status  # killed by a signal: 128 + its number, as a shell says
    finally:
        signal.signal(signal.SIGINT, interrupt)
        group.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cores", type=float, required=True, help="the cores the command may use, e.g. 1.2")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    try:
        return run(args.cores, command)
    except QuotaError as exc:
        print(f"cpu_quota: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
