"""TFNet against Keras on ResNet-50 (224x224, batch 16): one fine-tuning step, forward only, and ``TFNet.backward``
(a vector-Jacobian product: its first call, compiled, and later calls) against the same product of Keras's model
under a ``tf.GradientTape`` in a ``tf.function``.

Both sides run in this one process, on the same model, data, batch and threads, timed in
alternation. Fine-tuning trains every weight with batch norm frozen (inference mode) on both sides.

    python benchmarks/bench_tfnet.py [--batch 16] [--rounds 5] [--onednn 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import banner, ceilings_line, finish, interleaved, machine, matmul_ceilings, median, resnet50_gflop, setup_env  # noqa: E402


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--onednn", type=int, default=1)
    p.add_argument("--threads", type=int, default=0, help="intra/inter-op threads; 0 = TF default")
    p.add_argument("--only", choices=["train", "forward", "backward"], default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    setup_env(bool(args.onednn), args.threads or None)

    import keras
    import numpy as np
    import tensorflow as tf

    from tfnet import TFNet

    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, input_shape=(args.size, args.size, 3))
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (args.batch, args.size, args.size, 3)).astype("float32")
    y = rng.integers(0, 1000, args.batch).astype("int64")
    lr = 1e-3

    net = TFNet.from_keras(model)  # BN statistics frozen; every other weight trains
    results = {"machine": machine(), "batch": args.batch, "size": args.size, "ceilings": matmul_ceilings()}
    print(banner(), flush=True)
    print(ceilings_line(results["ceilings"]), flush=True)
    fp32_ceiling = results["ceilings"]["fp32_gflops"]

    if args.only in (None, "train"):
        for layer in model.layers:  # Keras side: BN frozen (inference mode in Keras 3)
            if isinstance(layer, keras.layers.BatchNormalization):
                layer.trainable = False
        model.compile(optimizer=keras.optimizers.SGD(lr), loss="sparse_categorical_crossentropy")
        # Like with like: the same trainable set (frozen BN layers also freeze gamma and beta).
        net.trainable = [v.path for v in model.trainable_variables]
        results["trainable_weights"] = len(net.trainable)
        sce = keras.losses.SparseCategoricalCrossentropy()
        step = net.train_step(lambda t, o: sce(t, o), lr)
        state = step.init_state()
        xt, yt = tf.constant(x), tf.constant(y)

        def tfnet_step():
            step(xt, yt, state).loss.numpy()

        def keras_step():
            model.train_on_batch(x, y)

        times = interleaved({"tfnet": tfnet_step, "keras": keras_step}, args.rounds)
        t_tfnet, t_keras = median(times["tfnet"]), median(times["keras"])
        results["train"] = {
            "tfnet_img_s": args.batch / t_tfnet,
            "keras_img_s": args.batch / t_keras,
            "ratio": t_keras / t_tfnet,
            "ratio_best": min(times["keras"]) / min(times["tfnet"]),
            "keras_jit_compile": str(model.jit_compile),
            "times": times,
        }
        print(f"fine-tune step   TFNet {args.batch / t_tfnet:6.2f} img/s   Keras train_on_batch "
              f"{args.batch / t_keras:6.2f} img/s   ratio {t_keras / t_tfnet:.2f}  (target >= 1.0)")
        share = args.batch / t_tfnet * resnet50_gflop(args.size, training=True) / fp32_ceiling
        results["train"]["tfnet_share_of_fp32_ceiling"] = share
        print(f"                 TFNet at {100 * share:.0f}% of the fp32 matmul ceiling "
              f"({resnet50_gflop(args.size, training=True):.1f} GFLOP an image; target >= 88%)")

    if args.only in (None, "forward"):
        xt = tf.constant(x)

        def tfnet_fwd():
            net.forward(xt)

        def keras_fwd():
            model.predict(x, batch_size=args.batch, verbose=0)

        times = interleaved({"tfnet": tfnet_fwd, "keras": keras_fwd}, args.rounds)
        t_tfnet, t_keras = median(times["tfnet"]), median(times["keras"])
        results["forward"] = {
            "tfnet_img_s": args.batch / t_tfnet,
            "keras_img_s": args.batch / t_keras,
            "ratio": t_keras / t_tfnet,
            "ratio_best": min(times["keras"]) / min(times["tfnet"]),
            "times": times,
        }
        print(f"forward          TFNet {args.batch / t_tfnet:6.2f} img/s   Keras predict          "
              f"{args.batch / t_keras:6.2f} img/s   ratio {t_keras / t_tfnet:.2f}  (target >= 1.0)")
        share = args.batch / t_tfnet * resnet50_gflop(args.size) / fp32_ceiling
        results["forward"]["tfnet_share_of_fp32_ceiling"] = share
        print(f"                 TFNet at {100 * share:.0f}% of the fp32 matmul ceiling")
    if args.only in (None, "backward"):
        results["backward"] = _backward(net, model, x, args.rounds, args.batch)
    print(f"machine: {results['machine']}")
    finish(args.json, results)
    return results


def _backward(net, model, x, rounds: int, batch: int) -> dict:
    """``net.backward(x, g)`` against Keras's own vector-Jacobian product of the same outputs, input and trainable
    weights (compiled once, as tfnet's is): the first call of each (tracing and Grappler included), then the
    median of ``rounds`` calls, in alternation."""
    import time

    import numpy as np
    import tensorflow as tf

    net.trainable = [v.path for v in model.trainable_variables]  # the same trainable set on both sides
    xt = tf.constant(x)
    g = tf.constant(np.random.default_rng(1).normal(size=(batch, *model.output_shape[1:])).astype("float32"))

    @tf.function(autograph=False)
    def keras_vjp(inputs, grad):
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            y = model(inputs, training=False)
        return tape.gradient(y, [inputs] + model.trainable_variables, output_gradients=grad)

    first = {}
    for name, fn in (("tfnet", lambda: net.backward(xt, g, as_tensors=True)[0].numpy()),
                     ("keras", lambda: keras_vjp(xt, g)[0].numpy())):
        cpu, wall = time.process_time(), time.perf_counter()
        fn()
        first[name] = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}
    times = interleaved({"tfnet": lambda: net.backward(xt, g, as_tensors=True)[0].numpy(),
                         "keras": lambda: keras_vjp(xt, g)[0].numpy()}, rounds, warmup=0)
    t_tfnet, t_keras = median(times["tfnet"]), median(times["keras"])
    print(f"backward         TFNet {batch / t_tfnet:6.2f} img/s   Keras tape (tf.function) "
          f"{batch / t_keras:6.2f} img/s   ratio {t_keras / t_tfnet:.2f}")
    print(f"                 first call: TFNet {first['tfnet']['cpu_s']:.2f} CPU-s ({first['tfnet']['wall_s']:.2f} s), "
          f"Keras {first['keras']['cpu_s']:.2f} CPU-s ({first['keras']['wall_s']:.2f} s)")
    return {"tfnet_img_s": batch / t_tfnet, "keras_img_s": batch / t_keras, "ratio": t_keras / t_tfnet,
            "first_call": first, "times": times}


if __name__ == "__main__":
    main()
