"""What the dropout switches cost in inference (tfnet.keras_training): ``net.forward`` of ``TFNet.from_keras`` on
EfficientNet-B0 (10 ``Dropout`` layers, each frozen as a switch on the training phase) against the same model frozen
with its dropout rates at 0 (no switch: the same inference function, the graph frozen before the switches existed),
in alternation, after a warm-up. Grappler prunes a switch on a constant phase, so the ratio should be 1. And the same
model frozen with its batch norm switched for training too (``train_batch_norm=True``, as ``TFOptimizer.from_keras``
freezes it; inference runs the graph with the switches taken out): ratio 1 as well.

    python benchmarks/bench_keras_switches.py [--size 160] [--batch 16] [--rounds 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import banner, finish, interleaved, machine, median, setup_env  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--size", type=int, default=160)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    setup_env(True)
    print(banner(), flush=True)
    import keras
    import numpy as np

    from tfnet import TFNet

    keras.utils.set_random_seed(0)
    model = keras.applications.EfficientNetB0(weights=None, input_shape=(args.size, args.size, 3))
    switched = TFNet.from_keras(model)
    normed = TFNet.from_keras(model, train_batch_norm=True)
    assert normed.updates and normed.graph.inference_template is not None
    for layer in model._flatten_layers():
        if isinstance(layer, keras.layers.Dropout):
            layer.rate = 0.0  # a rate of 0 draws nothing: frozen without a switch
    plain = TFNet.from_keras(model)
    assert switched.phase_values and not plain.phase_values
    x = np.random.default_rng(0).uniform(-1, 1, (args.batch, args.size, args.size, 3)).astype(np.float32)
    np.testing.assert_allclose(switched.forward(x), plain.forward(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(normed.forward(x), switched.forward(x))
    times = interleaved({"switched": lambda: switched.forward(x), "plain": lambda: plain.forward(x),
                         "batch_norm": lambda: normed.forward(x)}, args.rounds)
    out = {"machine": machine(), "size": args.size, "batch": args.batch,
           "switched_img_s": args.batch / median(times["switched"]), "plain_img_s": args.batch / median(times["plain"]),
           "batch_norm_img_s": args.batch / median(times["batch_norm"]),
           "ratio": median(times["plain"]) / median(times["switched"]),
           "batch_norm_ratio": median(times["plain"]) / median(times["batch_norm"]), "times": times}
    print(f"forward  with switches {out['switched_img_s']:.1f} img/s   without {out['plain_img_s']:.1f} img/s   "
          f"ratio {out['ratio']:.3f} (target 1.0)")
    print(f"forward  with batch-norm switches too {out['batch_norm_img_s']:.1f} img/s   ratio "
          f"{out['batch_norm_ratio']:.3f} (target 1.0)")
    print(f"machine: {out['machine']}")
    finish(args.json, out)
    return out


if __name__ == "__main__":
    main()
