"""The accuracy cost of each sync mode: the digits transfer-learning task (a CNN pretrained on
digits 0-4, cut at its features, a new head fine-tuned on digits 5-9 with Adam; the same task as
the every-step tests) on 2 ranks over Spark local[2], each mode side by side in one run, against
one process as the baseline. Prints held-out accuracy, the final training loss, the bytes each rank
sent per step and the wall time of each ``optimize`` call.

    python benchmarks/bench_sync_accuracy.py [--epochs 4] [--rounds 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import banner, finish, machine, setup_env


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--rounds", type=int, default=1, help="shuffle seeds per mode")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    setup_env(True)

    import optim
    from optim import TFOptimizer
    from tests.spark_utils import local_spark
    from tests.tfnet import transfer

    spark = local_spark(2)
    from optim.launch.preflight import ensure_warm_up

    ensure_warm_up(spark).wait(600)  # the workers have imported TensorFlow: no mode pays for it
    (xtr, ytr), (xte, yte) = transfer.data()
    modes = {
        "1 process (baseline)": ("local", None),
        "every step, one call": (2, optim.EveryStep(overlap=False)),
        "every step, overlap (default)": (2, None),
        "every step, fp16": (2, optim.EveryStep(compression="fp16")),
        "every step, bf16": (2, optim.EveryStep(compression="bf16")),
        "local SGD K=4": (2, optim.LocalSGD(every=4)),
        "local SGD K=16": (2, optim.LocalSGD(every=16)),
        "local SGD K=4, Nesterov server (DiLoCo)": (2, optim.LocalSGD(every=4, server=optim.SGD(0.7, momentum=0.9,
                                                                                                   nesterov=True))),
        "async (staleness 1)": (2, optim.Asynchronous(staleness=1)),
    }
    print(banner(), flush=True)
    results: dict = {m: [] for m in modes}
    for seed in range(args.rounds):
        for name, (workers, sync) in modes.items():
            net = transfer.new_net()
            opt = TFOptimizer(net, transfer.SCE, {"head/": optim.Adam(0.01), re.compile("^(?!head/)"): optim.Adam(0.002)},
                              metrics=["accuracy"])
            kw = {} if workers == "local" else {"num_workers": workers, "sync": sync}
            t0 = time.perf_counter()
            history = opt.optimize((xtr, ytr), epochs=args.epochs, batch_size=32, verbose=0, seed=seed, **kw)
            wall = time.perf_counter() - t0
            acc = transfer.accuracy(net.forward(xte), yte)
            results[name].append({"accuracy": acc, "loss": history["loss"][-1], "seconds": wall,
                                  "bytes_per_step": (history.get("bytes_per_step") or [0])[-1]})
            print(f"{name}: {results[name][-1]}", flush=True)
    print(f"\n{'mode':42s} {'held-out acc':>12s} {'final loss':>10s} {'KB/step':>8s} {'seconds':>8s}")
    for name, runs in results.items():
        acc = statistics.median(r["accuracy"] for r in runs)
        loss = statistics.median(r["loss"] for r in runs)
        print(f"{name:42s} {acc:12.4f} {loss:10.4f} {runs[-1]['bytes_per_step'] / 1e3:8.1f} "
              f"{statistics.median(r['seconds'] for r in runs):8.1f}")
    finish(args.json, {"machine": machine(), "epochs": args.epochs, "results": results})
    spark.stop()


if __name__ == "__main__":
    main()
