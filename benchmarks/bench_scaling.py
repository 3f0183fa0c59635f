"""Scaling efficiency of distributed fine-tuning on this machine: ResNet-50 at 224x224, 2 ranks of
1 thread each against 1 rank of 1 thread, the same per-rank batch, over Spark local[2] with
Horovod over Gloo. Efficiency = throughput(2) / (2 x throughput(1)). Also the share of each step
spent in the gradient allreduce (timed inside the compiled step, waiting for the other rank
included).

    python benchmarks/bench_scaling.py [--per-rank-batch 16] [--steps 8] [--rounds 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import machine, setup_env, write_json  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--per-rank-batch", type=int, default=16)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--steps", type=int, default=8, help="steps per run; the first 2 are warm-up")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--onednn", type=int, default=1)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    setup_env(bool(args.onednn))
    os.environ["PYSPARK_PYTHON"] = sys.executable

    import keras
    import numpy as np
    import tensorflow as tf
    from pyspark.sql import SparkSession

    import optim
    from optim import TFDataset, TFOptimizer
    from tfnet import TFNet

    spark = (SparkSession.builder.master("local[2]").appName("tfnet-scaling")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.task.cpus", "1")
             .config("spark.driver.memory", "6g").config("spark.driver.maxResultSize", "2g")
             .config("spark.executorEnv.TF_ENABLE_ONEDNN_OPTS", str(args.onednn))
             .config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2").getOrCreate())
    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, input_shape=(args.size, args.size, 3))
    b, size, steps = args.per_rank_batch, args.size, args.steps

    def synthetic(rank, n_ranks):
        rng = np.random.default_rng(rank)
        x = rng.uniform(-1, 1, (b, size, size, 3)).astype("float32")
        y = rng.integers(0, 1000, b).astype("int64")
        return tf.data.Dataset.from_tensors((x, y)).repeat(steps)

    results = {1: [], 2: []}
    shares = []
    for _ in range(args.rounds):
        for ranks in (1, 2):
            net = TFNet.from_keras(model)
            opt = TFOptimizer(net, "sparse_categorical_crossentropy", optim.SGD(1e-3, momentum=0.9))
            opt.optimize(TFDataset.from_tf_data(synthetic), epochs=1, num_workers=ranks, verbose=0,
                         timeout=900, startup_timeout=900)
            times = [t for t in opt.last_run["step_times"] if t][2:]
            step = statistics.median(times)
            results[ranks].append(ranks * b / step)
            if ranks == 2:
                comm = [c for c in opt.last_run["allreduce_seconds"] if c is not None][2:]
                shares.append(sum(comm) / sum(times))
            print(f"{ranks} rank(s): median step {step:.2f} s, {ranks * b / step:.2f} img/s "
                  f"(startup {opt.last_run['startup_s']:.1f} s)", flush=True)
    thr1, thr2 = statistics.median(results[1]), statistics.median(results[2])
    efficiency = thr2 / (2 * thr1)
    share = statistics.median(shares)
    print(f"scaling efficiency {efficiency:.3f} (target >= 0.95; Horovod publishes 0.90)   "
          f"allreduce share of a 2-rank step {share:.1%}")
    out = {"machine": machine(), "per_rank_batch": b, "steps": steps, "throughput_1": results[1],
           "throughput_2": results[2], "efficiency": efficiency, "allreduce_share": share}
    write_json(args.json, out)
    spark.stop()
    return out


if __name__ == "__main__":
    main()
