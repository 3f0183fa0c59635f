"""Horovod's response cache on and off: the step time of a two-rank, allreduce-heavy loop.

Two plain processes (no Spark), both fresh, meet through tfnet's secured rendezvous store and
average ``--tensors`` float32 gradients of ``--mb`` MB in all through tfnet's reducer (one grouped
allreduce named ``tfnet_grads_0`` plus ``tfnet_loss``) inside a ``tf.function``, ``--steps`` times.
Both configurations (cache capacity 0, tfnet's, or 1024, Horovod's default; everything else as
tfnet sets it) run ``--rounds`` times, interleaved; a run's figure is the median step after the
first, the mean of the two ranks.
The cache saves the negotiation of tensors already seen (a gather of every rank's requests on rank
0 and a broadcast of its responses); docs/distributed.md says why tfnet keeps it off.

    python benchmarks/bench_horovod_cache.py [--tensors 160] [--mb 100] [--steps 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import banner, finish

RANK = """
import json, statistics, sys, time
import numpy as np
rank, port, key = int(sys.argv[1]), int(sys.argv[2]), bytes.fromhex(sys.argv[3])
n, values, steps, extra = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), json.loads(sys.argv[7])
import tensorflow as tf
from optim.transport.client import GlooProxy
from optim.training.horovod import HorovodSession, horovod_env
sizes = np.maximum(1, np.random.default_rng(0).dirichlet(np.ones(n)) * values).astype(int)
proxy = GlooProxy(("127.0.0.1", port), key, timeout_s=60)
env = horovod_env(rank, 2, proxy.address[0], proxy.address[1], "lo", 60)
env.update(extra)
with HorovodSession(env, on_close=proxy.stop) as s:
    reduce = s.collective.reducer()
    grads = {f"g{i}": tf.fill([int(k)], float(rank + 1)) for i, k in enumerate(sizes)}
    step = tf.function(lambda g, l: reduce(g, l))
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        avg, loss = step(grads, tf.constant(1.0))
        float(loss)
        times.append(time.perf_counter() - t)
    assert abs(float(avg["g0"][0]) - 1.5) < 1e-6
print("STEP", statistics.median(times[1:]) if len(times) > 1 else times[0], flush=True)
"""


def run_pair(n: int, values: int, steps: int, extra: dict) -> float:
    from optim.transport.store import SecureRendezvous

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=root)
    key = os.urandom(32)
    with SecureRendezvous("127.0.0.1", 2, key) as rendezvous:
        procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), str(rendezvous.address[1]), key.hex(), str(n),
                                   str(values), str(steps), json.dumps(extra)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for r in range(2)]
        figures = []
        for p in procs:
            out, err = p.communicate(timeout=600)
            if p.returncode:
                raise RuntimeError(err[-2000:])
            figures.append(float(next(line.split()[1] for line in out.splitlines() if line.startswith("STEP "))))
    return statistics.mean(figures)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tensors", type=int, default=160)
    p.add_argument("--mb", type=float, default=100.0)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    print(banner(), flush=True)
    try:
        cpu = next(line for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
                   if line.startswith("Model name"))
        print("# lscpu:", " ".join(cpu.split()), flush=True)
    except (OSError, StopIteration):
        pass
    values = int(args.mb * 1e6 / 4)
    configs = {f"cache capacity {cache}": {"HOROVOD_CACHE_CAPACITY": str(cache)} for cache in (0, 1024)}
    results: dict[str, list[float]] = {name: [] for name in configs}
    for r in range(args.rounds):
        for name, extra in configs.items():
            results[name].append(run_pair(args.tensors, values, args.steps, extra))
            print(f"round {r + 1}: {name}: median step {results[name][-1] * 1000:.1f} ms", flush=True)
    print(f"{args.tensors} tensors, {args.mb:g} MB, {args.steps} steps, 2 ranks; median step over rounds:")
    for name, xs in results.items():
        print(f"  {name}: {statistics.median(xs) * 1000:.1f} ms (runs: {', '.join(f'{x * 1000:.1f}' for x in xs)})")
    finish(None, {"seconds": results})


if __name__ == "__main__":
    main()
