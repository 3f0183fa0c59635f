"""A short, real use of TFNet on scikit-learn's digits: freeze a Keras CNN to a .pb file, load it
as a TFNet, run forward and backward, apply one update, save, and reload.

    python examples/quickstart.py [--out runs/quickstart]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default="runs/quickstart")
    args = p.parse_args(argv)

    import keras
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits

    from tfnet import TFNet

    t0 = time.time()
    digits = load_digits()
    x = (digits.images[:256, :, :, None] / 16.0).astype("float32")
    y = digits.target[:256]

    # 1. A model that exists as a frozen graph file.
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((8, 8, 1), name="image"),
        keras.layers.Conv2D(8, 3, activation="relu", name="conv"),
        keras.layers.BatchNormalization(name="bn"),
        keras.layers.GlobalAveragePooling2D(name="features"),
        keras.layers.Dense(10, name="logits"),
    ])
    os.makedirs(args.out, exist_ok=True)
    pb = os.path.join(args.out, "digits_cnn.pb")
    with open(pb, "wb") as f:
        f.write(TFNet.from_keras(model).frozen_graph_def().SerializeToString())
    print(f"[1/6] froze a Keras CNN to {pb} ({os.path.getsize(pb):,} bytes)")

    # 2. Load it: the float constants become named, trainable weights.
    net = TFNet.from_frozen_graph(pb, inputs="image", outputs="logits")
    print(f"[2/6] loaded {net}")
    print(f"      weights: {net.weight_names}")
    print(f"      trainable: {net.trainable}  (batch-norm statistics frozen)")

    # 3. Forward.
    logits = net.forward(x)
    ce = lambda z: float(tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, z)))
    print(f"[3/6] forward: logits {logits.shape}, cross-entropy {ce(logits):.4f}, "
          f"accuracy {(logits.argmax(1) == y).mean():.3f}")

    # 4. Backward: d(loss)/d(logits) by hand, then the graph's vector-Jacobian product.
    probs = tf.nn.softmax(logits).numpy()
    grad_logits = (probs - np.eye(10, dtype="float32")[y]) / len(y)
    _, grads = net.backward(x, grad_logits)
    norms = {k: float(np.linalg.norm(g)) for k, g in grads.items()}
    print(f"[4/6] backward: gradient norms {', '.join(f'{k}={v:.3g}' for k, v in norms.items())}")

    # 5. One update through the weight-update hook, with a constraint hook.
    net.register_update_hook(lambda w: {k: tf.clip_by_value(v, -3.0, 3.0) for k, v in w.items()})
    net.apply_updates({k: -0.5 * g for k, g in grads.items()})
    after = net.forward(x)
    print(f"[5/6] one SGD step (lr 0.5): cross-entropy {ce(logits):.4f} -> {ce(after):.4f}")

    # 6. Save a frozen graph with the new weights, reload, and check it is the same layer.
    folder = os.path.join(args.out, "fine_tuned")
    net.save(folder)
    again = TFNet.load(folder)
    same = np.array_equal(again.forward(x), after) and again.trainable == net.trainable
    print(f"[6/6] saved to {folder}/ and reloaded: identical outputs and weights: {same}")
    if not same:
        raise SystemExit("reloaded layer differs from the saved one")
    print(f"done in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
