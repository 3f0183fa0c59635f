"""scripts/cpu_quota.py, a command run as a slower machine would: on this machine's real cgroups (CI runs as root)."""

import os
import re
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "cpu_quota.py")
# a child and its own child each print their cgroups and burn 0.4 CPU-s; then the status the command chose
PROGRAM = """
import subprocess, sys, time
BURN = "import time\\nprint(open('/proc/self/cgroup').read(), flush=True)\\nt = time.process_time()\\n" \\
       "while time.process_time() - t < 0.4: pass"
print(open('/proc/self/cgroup').read(), flush=True)
subprocess.run([sys.executable, "-c", BURN], check=True)
exec(BURN)
sys.exit(3)
"""


def quota(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120)


def groups_named(name: str) -> str:
    """The paths of cgroups called ``name`` in any hierarchy (empty: none)."""
    return subprocess.run(["find", "/sys/fs/cgroup", "-maxdepth", "3", "-name", name], capture_output=True,
                          text=True).stdout.strip()


def test_the_command_and_what_it_starts_run_throttled_in_a_group_that_is_gone_after():
    done = quota("--cores", "0.25", "--", sys.executable, "-c", PROGRAM)
    assert done.returncode == 3, (done.stdout, done.stderr)  # the command's own status
    groups = [g for g in done.stdout.split("\n\n") if g.strip()]
    assert len(groups) == 3, done.stdout  # the command, its child, and the command again
    names = [re.findall(r"tfnet-cpu-quota-\d+", g) for g in groups]
    assert all(names) and len({n[0] for n in names}) == 1, groups  # every one in the same new group
    # 0.8 CPU-s at a quarter of a core (25 ms of each 100 ms period): throttled in most periods
    line = done.stderr.strip().splitlines()[-1]
    throttled, periods = map(int, re.search(r"throttled in (\d+) of (\d+) periods", line).groups())
    assert throttled >= 8 and periods >= throttled, line
    assert not groups_named(names[0][0]), "the group outlived its command"


def test_a_quota_out_of_range_or_no_command_is_one_line():
    bad = quota("--cores", "0", "--", "true")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0, bad.stderr
    assert "--cores 0.0: give a number from 0.01 to" in bad.stderr
    none = quota("--cores", "1")
    assert none.returncode == 2 and "give the command after --" in none.stderr


def test_ctrl_c_ends_the_command_and_the_group_with_the_shells_status():
    waits = "import sys, time\nprint('ready', flush=True)\ntime.sleep(60)"
    run = subprocess.Popen([sys.executable, SCRIPT, "--cores", "0.5", "--", sys.executable, "-c", waits],
                           start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert run.stdout.readline() == "ready\n"  # the command runs: Ctrl-C reaches its whole process group
        os.killpg(run.pid, signal.SIGINT)
        _, err = run.communicate(timeout=30)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 128 + signal.SIGINT, err  # as a shell reports a command that SIGINT ended
    assert "KeyboardInterrupt" in err and err.count("Traceback") == 1, err  # the command's, not the script's
    assert not groups_named(f"tfnet-cpu-quota-{run.pid}"), "the group outlived its command"
