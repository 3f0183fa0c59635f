"""What a process pays to exit after importing tfnet: the CPU-seconds from the end of its program to the end of the
process, with tfnet's fast exit (:mod:`tfnet.fast_exit`, the default) and without it (``TFNET_FAST_EXIT=0``), side
by side.

Two programs, each in fresh interpreters, the two ways interleaved over ``--rounds`` rounds (medians; CPU-seconds,
user and system, from ``getrusage`` of the finished child; the program's own part from ``os.times()`` at its end):
``import tfnet, optim`` (what a rank process or a Spark daemon imports) and a Keras program (a small model frozen with
``TFNet.from_keras``, one forward and one backward pass).

    python benchmarks/bench_exit.py [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import banner, finish, median  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
END = "import os, sys; t = os.times(); sys.stderr.write(f'\\nBODY {t[0] + t[1]:.4f}\\n')"
PROGRAMS = {
    "import tfnet, optim": "import tfnet, optim\n" + END,
    "keras model": """
import numpy as np
import keras
import tfnet
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
net = tfnet.TFNet.from_keras(model)
x = np.ones((4, 8), np.float32)
net.forward(x)
net.backward(x)
""" + END,
}
WAYS = {"fast exit (default)": "1", "TFNET_FAST_EXIT=0": "0"}


def run_once(code: str, fast: str) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT, TFNET_FAST_EXIT=fast)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0 or "BODY " not in proc.stderr:
        raise RuntimeError(f"the program failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    body = float(proc.stderr.rsplit("BODY ", 1)[1].split()[0])
    total = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"total_cpu_s": total, "exit_cpu_s": total - body, "wall_s": wall}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    print(banner(), flush=True)
    runs: dict[str, dict[str, list[dict]]] = {p: {w: [] for w in WAYS} for p in PROGRAMS}
    for _ in range(args.rounds):
        for program, code in PROGRAMS.items():
            for way, fast in WAYS.items():
                runs[program][way].append(run_once(code, fast))
    results: dict = {"rounds": args.rounds, "programs": {}}
    print(f"{'program':22s} {'exit':20s} {'exit CPU-s':>10s} {'process CPU-s':>13s} {'wall s':>7s}")
    for program, ways in runs.items():
        results["programs"][program] = {}
        for way, rows in ways.items():
            figures = {k: median([r[k] for r in rows]) for k in ("exit_cpu_s", "total_cpu_s", "wall_s")}
            results["programs"][program][way] = figures
            print(f"{program:22s} {way:20s} {figures['exit_cpu_s']:10.2f} {figures['total_cpu_s']:13.2f} "
                  f"{figures['wall_s']:7.2f}")
        fast, slow = (results["programs"][program][w] for w in WAYS)
        print(f"{program:22s} saved per process: {slow['exit_cpu_s'] - fast['exit_cpu_s']:.2f} CPU-s, "
              f"{slow['wall_s'] - fast['wall_s']:.2f} s")
    return finish(args.json, results)


if __name__ == "__main__":
    main()
