"""Distributed training from a Spark Connect client against a classic session, side by side in one
run: the time from ``optimize()`` to the first training step (``last_run["startup_s"]``) and the
whole call, for the same small job (digits CNN, 2 ranks, numpy data, ``model_dir`` on local disk so
that the Connect client sees progress).

Both Sparks are local[2] on this machine: the classic one in this process, the Connect server in a
process of its own (pyspark's SparkConnectServer through spark-submit), as a remote one is. Each
mode gets one warm-up call first (its Python workers import TensorFlow once), then ``--rounds``
measured calls; classic runs before the Connect client opens (pyspark switches the whole process
to Connect while a Connect session is open).

    python benchmarks/bench_connect.py --rounds 3
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import banner, finish, median, setup_env  # noqa: E402


def run_job(model_dir: str) -> dict:
    import optim
    from optim import TFOptimizer
    from tests import digits
    from tfnet import TFNet

    x, y = digits.load()
    net = TFNet.from_keras(digits.cnn(classes=10, seed=0))
    opt = TFOptimizer(net, optim.losses.SparseCategoricalCrossentropy(from_logits=True), optim.SGD(0.05),
                      model_dir=model_dir)
    t0 = time.monotonic()
    opt.optimize((x[:512], y[:512]), epochs=1, batch_size=32, num_workers=2, verbose=0)
    return {"startup_s": opt.last_run["startup_s"], "wall_s": time.monotonic() - t0}


def measure(rounds: int) -> list[dict]:
    run_job(tempfile.mkdtemp(prefix="tfnet-bench-"))  # warm-up
    return [run_job(tempfile.mkdtemp(prefix="tfnet-bench-")) for _ in range(rounds)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    setup_env()
    from tests.connect_server import ConnectServer, close_session
    from tests.spark_utils import local_spark

    print(banner())
    classic = local_spark(2)
    results = {"classic": measure(args.rounds)}
    t0 = time.monotonic()
    server = ConnectServer(cores=2).start()
    session = server.session()
    connect_up = time.monotonic() - t0
    try:
        results["connect"] = measure(args.rounds)
    finally:
        close_session(session)
        server.stop()
        classic.stop()
    summary = {}
    for mode, runs in results.items():
        summary[mode] = {k: median([r[k] for r in runs]) for k in ("startup_s", "wall_s")}
        print(f"{mode:8s} start-up to the first step {summary[mode]['startup_s']:6.1f} s (median of {len(runs)}), "
              f"whole call {summary[mode]['wall_s']:6.1f} s; runs: "
              + ", ".join(f"{r['startup_s']:.1f}/{r['wall_s']:.1f}" for r in runs))
    print(f"connect/classic: start-up {summary['connect']['startup_s'] / summary['classic']['startup_s']:.2f}x, "
          f"whole call {summary['connect']['wall_s'] / summary['classic']['wall_s']:.2f}x; "
          f"the Connect server itself took {connect_up:.1f} s to start")
    finish(args.json, {"results": results, "summary": summary, "connect_server_start_s": connect_up})


if __name__ == "__main__":
    main()
