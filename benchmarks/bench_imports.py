"""What a process pays before its first job: the CPU-seconds of the imports every Python process of a tfnet
application runs (a driver, a Spark daemon, a rank process), and of what a Spark Python worker forked by tfnet's
daemon (``optim.spark.worker_daemon``) still imports for its task.

Each import runs in a fresh interpreter, the kinds interleaved over ``--rounds`` rounds (medians; CPU-seconds,
user and system, from ``getrusage``): ``import numpy`` (the baseline), ``import numpy, ml_dtypes``, ``import
tensorflow``, ``import tfnet, optim``. With ``--ml-dtypes DIR`` (a folder holding another ml_dtypes, for example
``pip install --target DIR --no-deps ml_dtypes==0.7.0``) the same imports also run with that ml_dtypes first on
the path, side by side.

Then a forked worker: a process that imported ``optim`` as the daemon does forks children that import
:data:`optim.spark.worker_daemon.WORKER_MODULES` and Horovod, once without the daemon's :func:`preload` (as before
it) and once after it.

    python benchmarks/bench_imports.py [--rounds 5] [--ml-dtypes DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import banner, finish, machine, setup_env  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMPORTS = {"numpy": "import numpy", "numpy, ml_dtypes": "import numpy, ml_dtypes",
           "tensorflow": "import tensorflow", "tfnet, optim": "import tfnet, optim"}

# in a process that imported optim as the daemon does: children forked without and with the daemon's preload
FORKED = """
import json, os, sys, time
import optim
from optim.spark import worker_daemon

def task_imports():
    for name in worker_daemon.WORKER_MODULES:
        __import__(name)
    from optim.horovod_import import import_horovod
    import_horovod()

def child_cpu(rounds):
    out = []
    for _ in range(rounds):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            t = time.process_time(); task_imports(); os.write(write, str(time.process_time() - t).encode()); os._exit(0)
        os.close(write); out.append(float(os.read(read, 64))); os.close(read); os.waitpid(pid, 0)
    return out

rounds = int(sys.argv[1])
before = child_cpu(rounds)
t = time.process_time(); worker_daemon.preload(); preload = time.process_time() - t
started = worker_daemon.threads_started_here()  # the daemon's own check: threads beyond numpy's
after = child_cpu(rounds)
print(json.dumps({"without_preload_s": before, "with_preload_s": after, "preload_in_daemon_s": preload,
                  "threads_started_here": started}))
"""


def cpu_of(code: str, env: dict) -> float:
    """CPU-seconds (user and system) of a fresh interpreter running ``code``."""
    start = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=ROOT, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    end = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (end.ru_utime - start.ru_utime) + (end.ru_stime - start.ru_stime)


def version_line(env: dict) -> str:
    return subprocess.run([sys.executable, "-c", "import ml_dtypes; print(ml_dtypes.__version__)"], env=env,
                          capture_output=True, text=True, check=True, cwd=ROOT).stdout.strip()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--ml-dtypes", default=None, help="a folder holding another ml_dtypes, run side by side")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    setup_env()
    print(banner())
    base = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    envs = {"installed": base}
    if args.ml_dtypes:
        envs["other"] = dict(base, PYTHONPATH=args.ml_dtypes + os.pathsep + base["PYTHONPATH"])
    versions = {side: version_line(env) for side, env in envs.items()}
    times: dict[str, dict[str, list[float]]] = {side: {k: [] for k in IMPORTS} for side in envs}
    for _ in range(args.rounds):
        for side, env in envs.items():
            for kind, code in IMPORTS.items():
                times[side][kind].append(cpu_of(code, env))
    result = {"machine": machine(), "rounds": args.rounds, "imports": {}}
    for side in envs:
        medians = {k: statistics.median(v) for k, v in times[side].items()}
        result["imports"][f"ml_dtypes {versions[side]}"] = {"median_cpu_s": medians, "cpu_s": times[side]}
        print(f"ml_dtypes {versions[side]}: " + ", ".join(f"import {k} {s:.2f} CPU-s" for k, s in medians.items()))
    forked = json.loads(subprocess.run([sys.executable, "-c", FORKED, str(args.rounds)], env=base, check=True,
                                       capture_output=True, text=True, cwd=ROOT).stdout.strip().splitlines()[-1])
    result["forked_worker"] = forked
    print(f"a forked worker's task imports: {statistics.median(forked['without_preload_s']):.2f} CPU-s without the "
          f"daemon's preload, {statistics.median(forked['with_preload_s']):.3f} with it (the daemon pays "
          f"{forked['preload_in_daemon_s']:.2f} once; threads it started: {forked['threads_started_here']})")
    finish(args.json, result)  # the machine and its matmul ceilings beside the figures, and the JSON


if __name__ == "__main__":
    main()
