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
it) and once after it. Last, after the preload, children that run a predicting task (a small CNN's frozen graph,
made beforehand in another process, loaded with ``TFNet.from_frozen_graph`` and run on 32 rows) and then one full
collection, as a worker's allocations bring one about: once as forked before the daemon froze its objects, once after
(:func:`optim.spark.worker_daemon.freeze_preloaded`): the task's CPU, the collection's, the pages the child copied
(minor faults) and its private memory at the end.

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
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import banner, finish, machine, setup_env  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMPORTS = {"numpy": "import numpy", "numpy, ml_dtypes": "import numpy, ml_dtypes",
           "tensorflow": "import tensorflow", "tfnet, optim": "import tfnet, optim"}

# in a process that imported optim as the daemon does: children forked without and with the daemon's preload
FORKED = """
import gc, json, os, resource, sys, time
import optim
from optim.spark import worker_daemon

def task_imports():
    for name in worker_daemon.WORKER_MODULES:
        __import__(name)
    from optim.horovod_import import import_horovod
    import_horovod()

def in_children(rounds, work):
    # work() in each of `rounds` children forked one after another; what each returned (JSON), through a pipe
    out = []
    for _ in range(rounds):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(write, json.dumps(work()).encode()); os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as f:
            out.append(json.loads(f.read()))
        os.waitpid(pid, 0)
    return out

def imports_cpu():
    t = time.process_time(); task_imports(); return time.process_time() - t

def predicting_task(graph):
    import numpy as np
    from tfnet import TFNet
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = time.process_time()
    net = TFNet.from_frozen_graph(graph["pb"], graph["inputs"], graph["outputs"])
    net.forward(np.full((32, 8, 8, 1), 0.5, np.float32))
    task = time.process_time() - t
    t = time.process_time(); gc.collect(); collect = time.process_time() - t
    with open("/proc/self/smaps_rollup") as f:
        private = sum(int(line.split()[1]) for line in f if line.startswith(("Private_Dirty", "Private_Clean")))
    return {"task_s": task, "collect_s": collect, "private_mib": private / 1024,
            "pages_copied": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults}

rounds = int(sys.argv[1])
before = in_children(rounds, imports_cpu)
t = time.process_time(); worker_daemon.preload(); preload = time.process_time() - t
started = worker_daemon.threads_started_here()  # the daemon's own check: threads beyond numpy's
after = in_children(rounds, imports_cpu)
graph = json.loads(sys.argv[2])
unfrozen = in_children(rounds, lambda: predicting_task(graph))
t = time.process_time(); worker_daemon.freeze_preloaded(); freeze = time.process_time() - t
frozen = in_children(rounds, lambda: predicting_task(graph))
print(json.dumps({"without_preload_s": before, "with_preload_s": after, "preload_in_daemon_s": preload,
                  "threads_started_here": started, "task_unfrozen": unfrozen, "task_frozen": frozen,
                  "freeze_in_daemon_s": freeze, "objects_frozen": gc.get_freeze_count()}))
"""

# a small CNN's frozen graph, made in a process of its own (the forking one must not have run TensorFlow)
GRAPH = """
import json, sys
import keras
from tfnet import TFNet
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((8, 8, 1), name="image"), keras.layers.Conv2D(16, 3, activation="relu"),
                          keras.layers.Flatten(), keras.layers.Dense(10)])
net = TFNet.from_keras(model)
with open(sys.argv[1], "wb") as f:
    f.write(net.frozen_graph_def().SerializeToString())
print(json.dumps({"pb": sys.argv[1], "inputs": net.input_names, "outputs": net.output_names}))
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
    with tempfile.TemporaryDirectory() as tmp:
        graph = subprocess.run([sys.executable, "-c", GRAPH, os.path.join(tmp, "cnn.pb")], env=base, check=True,
                               capture_output=True, text=True, cwd=ROOT).stdout.strip().splitlines()[-1]
        forked = json.loads(subprocess.run([sys.executable, "-c", FORKED, str(args.rounds), graph], env=base,
                                           check=True, capture_output=True, text=True, cwd=ROOT
                                           ).stdout.strip().splitlines()[-1])
    result["forked_worker"] = forked
    print(f"a forked worker's task imports: {statistics.median(forked['without_preload_s']):.2f} CPU-s without the "
          f"daemon's preload, {statistics.median(forked['with_preload_s']):.3f} with it (the daemon pays "
          f"{forked['preload_in_daemon_s']:.2f} once; threads it started: {forked['threads_started_here']})")
    for side in ("unfrozen", "frozen"):
        runs = forked[f"task_{side}"]
        print(f"a predicting task and one full collection in a worker forked {side}: the task "
              f"{statistics.median(r['task_s'] for r in runs):.3f} CPU-s, the collection "
              f"{statistics.median(r['collect_s'] for r in runs):.3f}, {statistics.median(r['pages_copied'] for r in runs):.0f}"
              f" pages copied, {statistics.median(r['private_mib'] for r in runs):.0f} MiB private")
    print(f"(the daemon froze {forked['objects_frozen']} objects in {forked['freeze_in_daemon_s']:.2f} CPU-s, once)")
    finish(args.json, result)  # the machine and its matmul ceilings beside the figures, and the JSON


if __name__ == "__main__":
    main()
