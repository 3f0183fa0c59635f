"""TFOptimizer (one worker, one process) against Keras model.fit: ResNet-50 fine-tuning at
224x224, batch 16, on the same synthetic data, with the same trainable set (BatchNormalization
layers frozen on both sides) and the same optimiser (SGD, momentum 0.9). ``--model efficientnetb0``: EfficientNet-B0,
whose 10 ``Dropout`` layers (nine blocks' drop-connect, its head's) both sides draw in every step. ``--train-batch-norm``:
the BatchNormalization layers train on both sides, in training mode (the batch's statistics, the moving ones updated:
``TFNet.from_keras(train_batch_norm=True)``, as ``TFOptimizer.from_keras`` freezes a compiled model).

Throughput: both sides in this process, one epoch each in alternation, after a warm-up epoch.
Memory: each side alone in a fresh subprocess (peak RSS is per process), launched from this run.

    python benchmarks/bench_optimizer.py [--model resnet50|efficientnetb0] [--train-batch-norm] [--steps 6] [--rounds 3]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import banner, finish, interleaved, machine, median, peak_rss_mb, setup_env  # noqa: E402

MOM = float(os.environ.get("BENCH_MOMENTUM", "0.9"))


def build(args, sides=("tfnet", "keras")):
    """Epoch functions for the requested sides. A side alone holds only its own model."""
    import gc

    import keras
    import numpy as np

    import optim
    from optim import TFOptimizer
    from tfnet import TFNet

    keras.utils.set_random_seed(0)
    make = {"resnet50": keras.applications.ResNet50, "efficientnetb0": keras.applications.EfficientNetB0}[args.model]
    model = make(weights=None, input_shape=(args.size, args.size, 3))
    rng = np.random.default_rng(0)
    n = args.batch * args.steps
    x = rng.uniform(-1, 1, (n, args.size, args.size, 3)).astype("float32")
    y = rng.integers(0, 1000, n).astype("int64")
    for layer in model.layers:  # Keras: frozen BN layers (gamma and beta too), unless they train
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.trainable = args.train_batch_norm
    fns = {}
    if "tfnet" in sides:
        net = TFNet.from_keras(model, train_batch_norm=args.train_batch_norm)
        assert bool(net.updates) == args.train_batch_norm
        net.trainable = [v.path for v in model.trainable_variables]  # the same trainable set
        opt = TFOptimizer(net, "sparse_categorical_crossentropy", optim.SGD(1e-3, momentum=MOM))
        fns["tfnet"] = lambda: opt.optimize((x, y), epochs=1, batch_size=args.batch, shuffle=False, verbose=0)
    if "keras" in sides:
        model.compile(optimizer=keras.optimizers.SGD(1e-3, momentum=MOM), loss="sparse_categorical_crossentropy")
        fns["keras"] = lambda: model.fit(x, y, epochs=1, batch_size=args.batch, shuffle=False, verbose=0)
    else:
        del model
        gc.collect()
    return fns, n


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", choices=["resnet50", "efficientnetb0"], default="resnet50")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--steps", type=int, default=10, help="steps per epoch")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--onednn", type=int, default=1)
    p.add_argument("--side", choices=["tfnet", "keras"], help="(internal) run one side for the memory figure")
    p.add_argument("--train-batch-norm", action="store_true")
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    setup_env(bool(args.onednn))
    print(banner(), flush=True)

    if args.side:  # one side alone: warm-up epoch + one epoch, then report peak RSS
        fns, n = build(args, sides=(args.side,))
        fns[args.side]()
        fns[args.side]()
        print(json.dumps({"peak_rss_mb": peak_rss_mb()}))
        return None

    fns, n = build(args)
    times = interleaved(fns, args.rounds)
    t_tfnet, t_keras = median(times["tfnet"]), median(times["keras"])
    best = min(times["keras"]) / min(times["tfnet"])
    out = {"machine": machine(), "model": args.model, "batch": args.batch, "steps_per_epoch": args.steps,
           "train_batch_norm": args.train_batch_norm,
           "tfnet_img_s": n / t_tfnet, "keras_img_s": n / t_keras, "throughput_ratio": t_keras / t_tfnet,
           "throughput_ratio_best": best, "times": times}
    print(f"fine-tuning  TFOptimizer {n / t_tfnet:6.2f} img/s   Keras fit {n / t_keras:6.2f} img/s   "
          f"ratio {t_keras / t_tfnet:.2f} (medians), {best:.2f} (best epochs)  (target >= 1.0)")
    if not args.no_memory:
        peaks = {}
        for side in ("tfnet", "keras"):
            cmd = [sys.executable, os.path.abspath(__file__), "--side", side, "--model", args.model,
                   "--batch", str(args.batch),
                   "--size", str(args.size), "--steps", str(args.steps), "--onednn", str(args.onednn)]
            cmd += ["--train-batch-norm"] if args.train_batch_norm else []
            res = subprocess.run(cmd, capture_output=True, text=True, check=True)
            peaks[side] = json.loads(res.stdout.strip().splitlines()[-1])["peak_rss_mb"]
        out["peak_rss_mb"] = peaks
        print(f"peak memory  TFOptimizer {peaks['tfnet']:.0f} MB   Keras fit {peaks['keras']:.0f} MB   "
              f"ratio {peaks['tfnet'] / peaks['keras']:.2f} (lower is better)")
    print(f"machine: {out['machine']}")
    finish(args.json, out)
    return out


if __name__ == "__main__":
    main()
