"""Scaling efficiency of distributed fine-tuning on this machine: ResNet-50 at 224x224, 2 ranks of
1 thread each against 1 rank of 1 thread, the same per-rank batch, over Spark local[2] with
Horovod over Gloo, for each sync mode (``optimize(sync=...)``): every step with one allreduce after
the backward pass, every step with bucketed overlap (the default), with fp16 compression, local SGD
with K=4 and K=16, and asynchronous; every step with overlap and local SGD K=16 also with
Horovod's threads at normal priority (``TFNET_HOROVOD_THREADS=normal``, how the ranks ran before
they were put at idle priority), side by side. Efficiency = throughput(2) / (2 x throughput(1)); a mode's
throughput is its mean step over whole exchange cycles after 2 warm-up steps. Also the exposed
allreduce share of each step (timed inside the compiled step, waiting for the other rank included)
and the megabytes each rank sends per step, as the run counted them.

The machine's own ceiling is measured too: the same 1-thread ResNet-50 training step in plain
TensorFlow (no Spark, no Horovod), in two processes at once against one process alone. A 2-vCPU VM
whose vCPUs share caches, memory bandwidth or a physical core cannot scale perfectly whatever runs
on it; efficiency / ceiling is the part tfnet is answerable for.

    python benchmarks/bench_scaling.py [--per-rank-batch 16] [--steps 8] [--rounds 1] [--modes local async]
                                       [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import banner, finish, machine, setup_env

CEILING = """
import os, sys, time
os.environ["TF_ENABLE_ONEDNN_OPTS"] = sys.argv[1]
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
import keras
b, size, steps = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
model = keras.applications.ResNet50(weights=None, input_shape=(size, size, 3))
opt = keras.optimizers.SGD(1e-3, momentum=0.9)
x = tf.random.uniform((b, size, size, 3), -1, 1)
y = tf.random.uniform((b,), 0, 1000, tf.int64)
@tf.function
def step():
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, model(x, training=False)))
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss
step().numpy(); step().numpy()
times = []
for _ in range(steps):
    t = time.perf_counter(); step().numpy(); times.append(time.perf_counter() - t)
times.sort()
print(b / times[len(times) // 2])
"""


def machine_ceiling(onednn: int, b: int, size: int, steps: int) -> dict:
    """Plain-TF 1-thread training throughput: one process alone, then two at once."""
    import subprocess

    cmd = [sys.executable, "-c", CEILING, str(onednn), str(b), str(size), str(steps)]

    def run(n):
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for _ in range(n)]
        return [float(p.communicate()[0].strip().splitlines()[-1]) for p in procs]

    alone = run(1)[0]
    pair = run(2)
    return {"alone_img_s": alone, "pair_img_s": pair, "ceiling": sum(pair) / (2 * alone)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--per-rank-batch", type=int, default=16)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--steps", type=int, default=8, help="steps per run; the first 2 are warm-up")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--onednn", type=int, default=1)
    p.add_argument("--no-ceiling", action="store_true", help="skip the plain-TF two-process ceiling")
    p.add_argument("--modes", nargs="*", default=None,
                   help="run only the 2-rank modes whose names contain one of these words (e.g. local async)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    setup_env(bool(args.onednn))
    os.environ["PYSPARK_PYTHON"] = sys.executable

    import keras
    import numpy as np
    import tensorflow as tf

    import optim
    from optim import TFDataset, TFOptimizer
    from optim.spark.session import build_session
    from tfnet import TFNet

    spark = build_session("tfnet-scaling", "local[2]", {
        "spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1", "spark.task.cpus": "1",
        "spark.driver.memory": "6g", "spark.driver.maxResultSize": "2g",
        "spark.executorEnv.TF_ENABLE_ONEDNN_OPTS": str(args.onednn)})
    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, input_shape=(args.size, args.size, 3))
    b, size, steps = args.per_rank_batch, args.size, args.steps

    def synthetic(n_steps):
        def fn(rank, n_ranks):
            rng = np.random.default_rng(rank)
            x = rng.uniform(-1, 1, (b, size, size, 3)).astype("float32")
            y = rng.integers(0, 1000, b).astype("int64")
            return tf.data.Dataset.from_tensors((x, y)).repeat(n_steps)
        return fn

    normal = " [Horovod threads normal]"  # TFNET_HOROVOD_THREADS=normal: the ranks as before the idle priority
    modes = {
        "every step, one call after the backward pass": optim.EveryStep(overlap=False),
        "every step, bucketed overlap (default)": None,
        "every step, bucketed overlap (default)" + normal: None,
        "every step, overlap + fp16": optim.EveryStep(compression="fp16"),
        "local SGD K=4": optim.LocalSGD(every=4),
        "local SGD K=16": optim.LocalSGD(every=16),
        "local SGD K=16" + normal: optim.LocalSGD(every=16),
        "async (staleness 1)": optim.Asynchronous(staleness=1),
    }
    chosen = [m for m in modes if not args.modes or any(k in m for k in args.modes)]

    def run(ranks, sync, every=1, threads="idle"):
        """Throughput over whole exchange cycles after the warm-up (2 steps, or the first cycle of
        local SGD, whose first exchange compiles the server update): the mean step, exchanges
        included. ``threads``: TFNET_HOROVOD_THREADS for this run (read by optimize() on the driver)."""
        os.environ["TFNET_HOROVOD_THREADS"] = threads
        warm = max(2, every)
        steady = -(-max(steps - 2, every) // every) * every
        net = TFNet.from_keras(model)
        opt = TFOptimizer(net, "sparse_categorical_crossentropy", optim.SGD(1e-3, momentum=0.9))
        history = opt.optimize(TFDataset.from_tf_data(synthetic(warm + steady)), epochs=1, num_workers=ranks,
                               verbose=0, timeout=900, startup_timeout=900, sync=sync)
        times = [t for t in opt.last_run["step_times"] if t][warm:]
        comm = [c for c in opt.last_run["allreduce_seconds"] if c is not None][warm:]
        step = sum(times) / len(times)
        return {"img_s": ranks * b / step, "step_s": step, "steps": len(times),
                "allreduce_share": sum(comm) / sum(times) if comm else None,
                "bytes_per_step": (history.get("bytes_per_step") or [0])[-1],
                "startup_s": opt.last_run["startup_s"]}

    print(banner(), flush=True)
    results = {"1 rank": []}
    results.update({m: [] for m in chosen})
    for _ in range(args.rounds):
        results["1 rank"].append(run(1, None))
        print(f"1 rank: {results['1 rank'][-1]}", flush=True)
        for m in chosen:
            sync = modes[m]
            results[m].append(run(2, sync, getattr(sync, "every", 1), "normal" if m.endswith(normal) else "idle"))
            print(f"2 ranks, {m}: {results[m][-1]}", flush=True)
    thr1 = statistics.median(r["img_s"] for r in results["1 rank"])
    out = {"machine": machine(), "per_rank_batch": b, "size": size, "steps": steps, "runs": results,
           "throughput_1": thr1, "modes": {}}
    ceiling = None
    if not args.no_ceiling:
        spark.stop()
        ceiling = machine_ceiling(args.onednn, b, size, max(4, steps - 2))
        out["machine_ceiling"] = ceiling
        print(f"machine ceiling (plain TF, 1 thread, 2 processes at once vs 1 alone): {ceiling['ceiling']:.3f} "
              f"({ceiling['alone_img_s']:.2f} img/s alone, {sum(ceiling['pair_img_s']):.2f} img/s together)")
    print(f"\n1 rank: {thr1:.2f} img/s")
    print(f"{'2 ranks':70s} {'img/s':>7s} {'efficiency':>10s} {'/ ceiling':>9s} {'allreduce':>9s} {'MB sent/step':>12s}")
    for m in chosen:
        thr2 = statistics.median(r["img_s"] for r in results[m])
        eff = thr2 / (2 * thr1)
        rel = eff / ceiling["ceiling"] if ceiling else float("nan")
        share = results[m][-1]["allreduce_share"]
        mb = results[m][-1]["bytes_per_step"] / 1e6
        out["modes"][m] = {"throughput_2": thr2, "efficiency": eff, "of_ceiling": rel, "mb_per_step": mb}
        print(f"{m:70s} {thr2:7.2f} {eff:10.3f} {rel:9.3f} {share if share is not None else float('nan'):9.1%} "
              f"{mb:12.1f}")
    finish(args.json, out)
    spark.stop()
    return out


if __name__ == "__main__":
    main()
