"""Full fine-tuning against LoRA on a BERT-sized encoder over Spark local[2] with two Horovod ranks.

The encoder is built here with Keras layers (no download): token and position embeddings, ``--layers``
post-norm Transformer blocks of ``--hidden`` units (``MultiHeadAttention`` with ``--hidden / 64`` heads,
a GELU feed-forward of 4 x hidden), the first position's output through a tanh pooler and a 2-way
classifier: BERT-base's shape at the defaults (12 x 768, 85M parameters in the blocks). It is frozen
into a TFNet with ``TFNet.from_keras``, then trained two ways from the same weights, on the same rows,
for the same number of steps:

* full fine-tuning: every weight trains (Adam, ``--lr-full``);
* LoRA: ``with_lora`` rank ``--rank`` on the attention projections (query, key, value and output
  kernels, Keras's ``EinsumDense`` layout), the adapters and the pooler and classifier train (Adam,
  ``--lr-lora``); the rest is frozen.

The task (written here): 64 token ids (vocabulary 1,000) starting with a ``[CLS]`` id; the label says
whether a marker id fills 8 random positions after it (half the rows), so what the first position
attends to decides. ``--epochs`` passes over ``--steps`` batches.

Reported per run: the mean step after 2 warm-up steps (from the ranks' own step timings), the bytes
each rank sends per step (as the run counted them), each rank's peak resident memory
(VmHWM of the rank's process, read from /proc while it runs; the ranks' pids come from
``model_dir/ranks/<run>/rank-N.json``), and the accuracy on 512 held-out rows after the run. Each run
has a fresh Spark application, so a reused Python worker cannot carry another run's peak.

    python benchmarks/bench_lora.py [--layers 12 --hidden 768] [--steps 16 --epochs 3] [--per-rank-batch 8]
                                    [--small] [--json docs/bench_lora.json]

``--small`` is a quick check (2 layers x 128 units).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import banner, finish, machine, setup_env

VOCAB, SEQ, CLS, MARKER = 1000, 64, 0, 1
ATTENTION = r"_attn/(query|key|value|attention_output)/kernel$"


def encoder(layers: int, hidden: int, seed: int = 0):
    """A BERT-shaped classifier as a Keras model (post-norm blocks, GELU feed-forward)."""
    import keras

    keras.utils.set_random_seed(seed)

    class Positions(keras.layers.Layer):
        def build(self, shape):
            self.table = self.add_weight(shape=(shape[1], shape[2]), initializer="random_normal", name="table")

        def call(self, x):
            return x + self.table

    ids = keras.Input((SEQ,), dtype="int32", name="ids")
    x = Positions(name="positions")(keras.layers.Embedding(VOCAB, hidden, name="tokens")(ids))
    x = keras.layers.LayerNormalization(epsilon=1e-12, name="embed_norm")(x)
    for i in range(layers):
        a = keras.layers.MultiHeadAttention(hidden // 64, 64, name=f"l{i}_attn")(x, x)
        x = keras.layers.LayerNormalization(epsilon=1e-12, name=f"l{i}_norm1")(x + a)
        f = keras.layers.Dense(4 * hidden, activation="gelu", name=f"l{i}_ffn1")(x)
        f = keras.layers.Dense(hidden, name=f"l{i}_ffn2")(f)
        x = keras.layers.LayerNormalization(epsilon=1e-12, name=f"l{i}_norm2")(x + f)
    pooled = keras.layers.Dense(hidden, activation="tanh", name="pooler")(x[:, 0])
    return keras.Model(ids, keras.layers.Dense(2, name="classifier")(pooled))


def task(n: int, seed: int):
    """Token ids with [CLS] first; label 1 when the marker fills 8 random positions after it."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = rng.integers(2, VOCAB, (n, SEQ)).astype("int32")
    ids[:, 0] = CLS
    labels = rng.integers(0, 2, n).astype("int64")
    for row in np.flatnonzero(labels):
        ids[row, rng.choice(np.arange(1, SEQ), 8, replace=False)] = MARKER
    return ids, labels


class PeakWatcher:
    """Polls the ranks' VmHWM while a run goes on; the pids come from the rank info files."""

    def __init__(self, model_dir: str):
        self.model_dir, self.peaks, self.stop = model_dir, {}, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self._poll()

    def _poll(self):
        for path in glob.glob(os.path.join(self.model_dir, "ranks", "*", "rank-*.json")):
            try:
                info = json.load(open(path))
                with open(f"/proc/{info['pid']}/status") as f:
                    kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
            except (OSError, ValueError, StopIteration, KeyError):
                continue
            self.peaks[info["rank"]] = max(self.peaks.get(info["rank"], 0), kb / 1024)

    def _run(self):
        while not self.stop.wait(0.5):
            self._poll()


def run(kind: str, weights: dict, args, data, held) -> dict:
    import numpy as np
    import tensorflow as tf

    import optim
    from optim import TFOptimizer
    from optim.spark.session import build_session
    from tfnet import TFNet

    spark = build_session(f"tfnet-lora-{kind}", "local[2]", {
        "spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1", "spark.task.cpus": "1",
        "spark.driver.memory": "4g", "spark.driver.maxResultSize": "3g",
        "spark.executorEnv.TF_ENABLE_ONEDNN_OPTS": str(args.onednn)}, verbose=0)
    net = TFNet.from_keras(encoder(args.layers, args.hidden))
    net.set_weights(weights)
    if kind == "lora":
        net = net.with_lora(re.compile(ATTENTION), rank=args.rank, seed=0)
        net.trainable = net.adapter_names + [n for n in net.weight_names if n.startswith(("pooler/", "classifier/"))]
        lr = args.lr_lora
    else:
        lr = args.lr_full
    trainable = sum(int(np.prod(net.weight_variables[n].shape)) for n in net.trainable)

    def loss(y, logits):
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(tf.cast(y, tf.int32), logits))

    model_dir = tempfile.mkdtemp(prefix=f"tfnet-bench-lora-{kind}-")
    opt = TFOptimizer(net, loss, optim.Adam(lr), model_dir=model_dir)
    t0 = time.perf_counter()
    with PeakWatcher(model_dir) as watcher:
        history = opt.optimize(data, epochs=args.epochs, batch_size=2 * args.per_rank_batch, shuffle=False, num_workers=2,
                               verbose=0, checkpoint_every=10**6, timeout=3600, startup_timeout=900)
    wall = time.perf_counter() - t0
    spark.stop()
    times = [t for t in opt.last_run["step_times"] if t][2:]
    logits = net.forward(held[0], batch_size=64)
    accuracy = float(np.mean(np.argmax(logits, 1) == held[1]))
    out = {"trainable_params": trainable, "params": sum(int(np.prod(v.shape)) for v in net.weight_variables.values()),
           "lr": lr, "step_s": sum(times) / len(times), "steps": opt.global_step,
           "bytes_per_step": history["bytes_per_step"][-1], "peak_rss_mb": dict(sorted(watcher.peaks.items())),
           "loss_per_epoch": history["loss"], "accuracy": accuracy, "wall_s": wall}
    print(f"{kind}: {out}", flush=True)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--steps", type=int, default=16, help="steps per epoch; the first 2 of the run are warm-up")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--per-rank-batch", type=int, default=8)
    p.add_argument("--lr-full", type=float, default=1e-4)
    p.add_argument("--lr-lora", type=float, default=1e-3)
    p.add_argument("--onednn", type=int, default=1)
    p.add_argument("--small", action="store_true", help="2 layers x 128 units: a quick check")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.small:
        args.layers, args.hidden = 2, 128
    setup_env(bool(args.onednn))
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the ranks import this checkout's code
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)

    from tfnet import TFNet

    print(banner(), flush=True)
    weights = TFNet.from_keras(encoder(args.layers, args.hidden)).get_weights()
    data = task(args.steps * 2 * args.per_rank_batch, seed=1)
    held = task(512, seed=2)
    results = {kind: run(kind, weights, args, data, held) for kind in ("full", "lora")}
    full, lora = results["full"], results["lora"]
    print(f"\n{args.layers} layers x {args.hidden}, {full['params'] / 1e6:.1f}M parameters, {full['steps']} steps of "
          f"{2 * args.per_rank_batch} rows (2 ranks x {args.per_rank_batch}), LoRA rank {args.rank} on the attention "
          "projections")
    print(f"{'':22s} {'trainable':>12s} {'step s':>8s} {'MB sent/step':>12s} {'peak MB/rank':>14s} {'accuracy':>9s}")
    for kind, r in results.items():
        peak = max(r["peak_rss_mb"].values()) if r["peak_rss_mb"] else float("nan")
        print(f"{kind:22s} {r['trainable_params']:12,d} {r['step_s']:8.2f} {r['bytes_per_step'] / 1e6:12.2f} "
              f"{peak:14.0f} {r['accuracy']:9.3f}")
    ratios = {"step_time": lora["step_s"] / full["step_s"], "bytes": lora["bytes_per_step"] / full["bytes_per_step"],
              "peak_rss": (max(lora["peak_rss_mb"].values()) / max(full["peak_rss_mb"].values())
                           if lora["peak_rss_mb"] and full["peak_rss_mb"] else None)}
    print(f"LoRA / full: step time {ratios['step_time']:.2f}, bytes per step {ratios['bytes']:.4f}, peak memory "
          f"{ratios['peak_rss'] if ratios['peak_rss'] is not None else float('nan'):.2f}")
    finish(args.json, {"machine": machine(), "args": vars(args), "runs": results, "lora_over_full": ratios})
    return results


if __name__ == "__main__":
    main()
