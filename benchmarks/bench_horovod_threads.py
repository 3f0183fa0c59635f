"""What Horovod's own threads cost a training rank's computation, without Spark: two ranks over
Gloo on loopback (two processes, tfnet's rendezvous store), each running a 1-thread TensorFlow
computation (a chain of 512x512 matmuls) for ``--seconds`` while Horovod is initialised and idle,
in three settings side by side:

- ``no Horovod``: the computation alone in each process (the baseline);
- ``threads normal``: Horovod's threads as Horovod makes them (``TFNET_HOROVOD_THREADS=normal``);
- ``threads idle``: under ``SCHED_IDLE``, as tfnet's ranks run them (optim/training/comm_threads.py).

Printed: each rank's computations per second and their ratio to the baseline, and the time of a
100 MB allreduce (25M float32) once the computation has stopped, in each setting.

    python benchmarks/bench_horovod_threads.py [--seconds 8] [--rounds 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import banner, finish, machine

RANK = textwrap.dedent("""
    import json, sys, time
    rank, port, key = int(sys.argv[1]), int(sys.argv[2]), bytes.fromhex(sys.argv[3])
    setting, seconds = sys.argv[4], float(sys.argv[5])
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    a = tf.random.uniform((512, 512))

    @tf.function
    def work():
        x = a
        for _ in range(20):
            x = tf.matmul(x, a) * 1e-3
        return tf.reduce_sum(x)

    def rate():
        work().numpy()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            work().numpy()
            n += 1
        return n / (time.perf_counter() - t0)

    if setting == "no Horovod":
        print("RESULT " + json.dumps({"rate": rate(), "allreduce_s": None}), flush=True)
        sys.exit()
    import horovod.tensorflow as hvd
    from optim.transport.client import GlooProxy
    from optim.training.horovod import HorovodSession, horovod_env

    proxy = GlooProxy(("127.0.0.1", port), key, timeout_s=60)
    env = horovod_env(rank, 2, proxy.address[0], proxy.address[1], "lo", 60)
    with HorovodSession(env, on_close=proxy.stop, threads=setting.split()[-1]):
        r = rate()
        g = tf.random.uniform((25_000_000,))
        hvd.allreduce(g, name="warm").numpy()
        t0 = time.perf_counter()
        for i in range(3):
            hvd.allreduce(g, name=f"g{i}").numpy()
        ar = (time.perf_counter() - t0) / 3
    print("RESULT " + json.dumps({"rate": r, "allreduce_s": ar}), flush=True)
""")

SETTINGS = ("no Horovod", "threads normal", "threads idle")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tests.horovod_utils import result_of, run_rank_pair

    print(banner(), flush=True)
    runs = {s: [] for s in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for setting in SETTINGS:
                outs = run_rank_pair(RANK, Path(tmp), args=(setting, str(args.seconds)), timeout_s=300)
                for rc, _, stderr in outs:
                    if rc != 0:
                        raise SystemExit(f"a rank failed ({setting}):\n{stderr[-3000:]}")
                runs[setting].append([result_of(out) for _, out, _ in outs])
                print(setting, runs[setting][-1], flush=True)
    base = statistics.median(r["rate"] for pair in runs["no Horovod"] for r in pair)
    out = {"machine": machine(), "seconds": args.seconds, "runs": runs, "settings": {}}
    print(f"\n{'setting':16s} {'matmul chains/s per rank':>25s} {'/ no Horovod':>12s} {'100 MB allreduce':>17s}")
    for setting in SETTINGS:
        rate = statistics.median(r["rate"] for pair in runs[setting] for r in pair)
        ars = [r["allreduce_s"] for pair in runs[setting] for r in pair if r["allreduce_s"] is not None]
        ar = statistics.median(ars) if ars else None
        out["settings"][setting] = {"rate": rate, "of_baseline": rate / base, "allreduce_s": ar}
        print(f"{setting:16s} {rate:25.1f} {rate / base:12.3f} {'-' if ar is None else f'{ar * 1e3:.0f} ms':>17s}")
    finish(args.json, out)
    return out


if __name__ == "__main__":
    main()
