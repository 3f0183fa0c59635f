"""The cluster image's `predict` job: TFPredictor over a Spark DataFrame on the cluster, checked
against ``net.forward`` on the driver.

    tfnet-entrypoint predict [--model /shared/export] [--rows 600] [--output /shared/predict]

It scores scikit-learn's digits (real 8x8 images that ship with the package), ``--partitions``
partitions of them, with a TFNet: the export folder, SavedModel or frozen graph given with
``--model`` (a frozen graph also needs ``--inputs`` / ``--outputs``), or else a small digits CNN made
here. It writes ``predictions.npz`` (``id``, ``outputs``) and ``result.json`` (rows, the largest
difference from ``net.forward``, the hosts that loaded the model) to ``--output``, and exits with 1
when TFPredictor's outputs differ from ``net.forward``'s. Only tfnet's public API is used.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tfnet-predict", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--master", default="local[2]", help="Spark master URL (default: local[2])")
    p.add_argument("--model", help="export folder, SavedModel folder or .pb (default: a digits CNN made here)")
    p.add_argument("--inputs", help="input tensor name, for a .pb")
    p.add_argument("--outputs", help="output tensor name, for a .pb")
    p.add_argument("--rows", type=int, default=600, help="digits to score (at most 1797)")
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--batch-per-thread", type=int, default=64)
    p.add_argument("--backend", default="tensorflow", choices=["tensorflow", "openvino"])
    p.add_argument("--tolerance", type=float, default=1e-5, help="largest allowed difference from net.forward")
    p.add_argument("--output", default="predict-out", help="folder for predictions.npz and result.json")
    args = p.parse_args(argv)
    if not 1 <= args.rows <= 1797:
        p.error(f"--rows must be between 1 and 1797 (the digits there are). Received: {args.rows}")
    return args


def digits(rows: int):
    import numpy as np
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.images[:rows, :, :, None] / 16.0).astype(np.float32)


def make_net(args: argparse.Namespace):
    from tfnet import TFNet

    if args.model:
        if args.model.endswith(".pb"):
            return TFNet.from_frozen_graph(args.model, inputs=args.inputs, outputs=args.outputs)
        if os.path.exists(os.path.join(args.model, "saved_model.pb")):
            return TFNet.from_saved_model(args.model)
        return TFNet.load(args.model)
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((8, 8, 1), name="image"),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="conv1"),
        keras.layers.Flatten(name="flat"),
        keras.layers.Dense(10, name="logits"),
    ], name="digits")
    return TFNet.from_keras(model)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import numpy as np
    from pyspark.sql import SparkSession

    from optim import TFPredictor

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (SparkSession.builder.appName("tfnet-predict").master(args.master)
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.executor.memory", "1g")
               .config("spark.executorEnv.TF_ENABLE_ONEDNN_OPTS", os.environ["TF_ENABLE_ONEDNN_OPTS"])
               .config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
               .config("spark.python.daemon.module", "optim.spark.worker_daemon"))  # workers forked with TF
    if os.environ.get("SPARK_LOCAL_IP"):
        builder = builder.config("spark.driver.host", os.environ["SPARK_LOCAL_IP"])
    spark = builder.getOrCreate()
    try:
        net = make_net(args)
        x = digits(args.rows)
        df = spark.createDataFrame([(i, x[i].ravel().tolist()) for i in range(len(x))],
                                   "id long, pixels array<float>").repartition(args.partitions)
        t0 = time.time()
        with TFPredictor(net, batch_per_thread=args.batch_per_thread, backend=args.backend) as predictor:
            scored = predictor.predict(df, feature_cols="pixels", output_cols="outputs")
            rows = sorted(scored.select("id", "outputs").collect(), key=lambda r: r.id)
            stats = predictor.stats()
        seconds = time.time() - t0
    finally:
        spark.stop()

    ids = np.array([r.id for r in rows], np.int64)
    outputs = np.array([r.outputs for r in rows], np.float32)
    expected = net.forward(x[ids])
    diff = float(np.max(np.abs(outputs - expected))) if len(rows) == len(x) else float("inf")
    hosts = sorted({key.rsplit(":", 1)[0] for key in stats.get("loads", {})})  # keys: "host:pid"
    result = {"rows": len(rows), "seconds": seconds, "max_abs_diff": diff, "tolerance": args.tolerance,
              "hosts": hosts, "calls": stats.get("calls"), "backend": args.backend}
    os.makedirs(args.output, exist_ok=True)
    np.savez(os.path.join(args.output, "predictions.npz"), id=ids, outputs=outputs)
    with open(os.path.join(args.output, "result.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(f"TFPredictor scored {len(rows)} rows in {seconds:.1f} s on {', '.join(hosts) or '?'}; "
          f"largest difference from net.forward: {diff:.3g}")
    if len(rows) != len(x) or not diff <= args.tolerance:
        print(f"predict: TFPredictor's outputs differ from net.forward (expected {len(x)} rows within "
              f"{args.tolerance}, got {len(rows)} rows, difference {diff:.3g})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
