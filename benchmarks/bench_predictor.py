"""TFPredictor on ResNet-50 (224x224, batch 16), oneDNN on for TensorFlow.

(a) TFPredictor over Spark local[2] (two Python workers, one thread each, the model cached in
    each) against a plain single-process TF predict loop (``net.forward`` on 16 rows at a time,
    TensorFlow's default 2 threads) on the same images. Target ratio >= 0.9.
(b) The OpenVINO backend against the TensorFlow backend, both through TFPredictor's local path in
    this process, with the same threads (2) and batch. Target ratio >= 1.15. Also reported: the
    OpenVINO backend's share of the CPU's fp32 peak, and its largest difference from TensorFlow.
(c) TFPredictor (TensorFlow fp32) against Spark's own ``predict_batch_udf`` on the same cached
    DataFrame and the same Keras model (saved as ``.keras``, loaded once per Python worker by
    ``make_predict_fn``, batch 16), written the two ways a user writes it: ``model.predict(x)``, as
    in Spark's documentation, and ``model(x, training=False)``. Target: TFPredictor >= 1.5x the
    faster of the two, with equal outputs (the largest difference is printed).

Both sides of each comparison run in this one process run, in alternation, after a warm-up; the
median time per round gives the ratio.

    python benchmarks/bench_predictor.py [--images 64] [--rounds 5] [--only spark|openvino|udf] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import banner, ceilings_line, finish, interleaved, machine, matmul_ceilings, median, resnet50_gflop, setup_env  # noqa: E402


def spark_session(cores: int):
    import tempfile

    from optim.spark.session import build_session

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    tmp = tempfile.mkdtemp(prefix="tfnet-bench-")
    return build_session("bench-predictor", f"local[{cores}]", {
        "spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1", "spark.local.dir": tmp,
        "spark.driver.memory": "4g"})


def image_frame(spark, x, partitions: int):
    """The images as a cached DataFrame of flat float arrays, in ``partitions`` equal parts."""
    import numpy as np
    import pyarrow as pa

    n, size = len(x), int(np.prod(x.shape[1:]))
    column = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * size), pa.array(x.reshape(-1)))
    df = spark.createDataFrame(pa.table({"id": pa.array(np.arange(n)), "image": column})).repartition(partitions)
    df = df.cache()
    df.count()
    return df


def keras_predict_fn(path: str, call: str):
    """``make_predict_fn`` for ``predict_batch_udf``: loads the saved Keras model once per Python worker
    and predicts with ``model.predict`` (Spark's documented form) or ``model(x, training=False)``."""

    def make_predict_fn():
        import keras

        model = keras.models.load_model(path, compile=False)
        if call == "predict":
            return lambda inputs: model.predict(inputs, verbose=0)
        return lambda inputs: model(inputs, training=False).numpy()

    return make_predict_fn


def against_predict_batch_udf(args, net, model, x, ceilings: dict) -> dict:
    """(c): TFPredictor and ``predict_batch_udf`` on the same DataFrame, side by side."""
    import tempfile

    import numpy as np
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, FloatType

    from optim import TFPredictor

    path = os.path.join(tempfile.mkdtemp(prefix="tfnet-bench-udf-"), "resnet50.keras")
    model.save(path)
    spark = spark_session(args.cores)
    df = image_frame(spark, x, args.cores)
    predictor = TFPredictor(net, batch_per_thread=args.batch)
    udfs = {call: predict_batch_udf(keras_predict_fn(path, call), return_type=ArrayType(FloatType()),
                                    batch_size=args.batch, input_tensor_shapes=[[args.size, args.size, 3]])
            for call in ("predict", "call")}
    # Each side in Python workers of its own, with its own defaults: Spark keys a worker pool by the
    # environment captured when the frame's UDF is made, and TensorFlow keeps the thread pools its first user set.
    env, frames = spark.sparkContext.environment, {}
    for side in ("tfpredictor", "udf_predict", "udf_call"):
        env["TFNET_BENCH_SIDE"] = side
        frames[side] = (predictor.predict(df, feature_cols="image").select("id", "output") if side == "tfpredictor"
                        else df.select("id", udfs[side[4:]](F.col("image")).alias("output")))
    env.pop("TFNET_BENCH_SIDE")

    def outputs(frame):
        rows = sorted(frame.collect())
        return np.array([r["output"] for r in rows], np.float32)

    got = {k: outputs(f) for k, f in frames.items()}  # also the warm-up: each worker loads each model
    diffs = {k: float(np.abs(got[k] - got["tfpredictor"]).max()) for k in got if k != "tfpredictor"}
    times = interleaved({k: (lambda f=f: f.write.format("noop").mode("overwrite").save()) for k, f in frames.items()},
                        args.rounds)
    img_s = {k: args.images / median(t) for k, t in times.items()}
    best_udf = max(img_s["udf_predict"], img_s["udf_call"])
    out = {"img_s": img_s, "ratio_vs_best_udf": img_s["tfpredictor"] / best_udf,
           "ratio_vs_udf_predict": img_s["tfpredictor"] / img_s["udf_predict"],
           "ratio_vs_udf_call": img_s["tfpredictor"] / img_s["udf_call"], "max_abs_diff_vs_tfpredictor": diffs,
           "times": times}
    print(f"(c) on Spark local[{args.cores}], img/s: TFPredictor {img_s['tfpredictor']:6.2f}   predict_batch_udf with "
          f"model.predict {img_s['udf_predict']:6.2f}   with model(x) {img_s['udf_call']:6.2f}   TFPredictor / the faster "
          f"udf {out['ratio_vs_best_udf']:.2f} (target >= 1.5)")
    print(f"    max |udf - TFPredictor|: {', '.join(f'{k} {v:.2e}' for k, v in diffs.items())}")
    out["share_of_tf_matmul"] = {k: v * resnet50_gflop(args.size) / ceilings["fp32_gflops"] for k, v in img_s.items()}
    print("    GFLOP/s over TF's own fp32 matmul on this machine: "
          + "   ".join(f"{k} {100 * v:.0f}%" for k, v in out["share_of_tf_matmul"].items()))
    predictor.close()
    spark.stop()
    return out


def fp32_peak(cores: int, ghz: float, flop_per_cycle: int) -> float:
    """GFLOP/s: cores x GHz x fp32 FLOP per cycle (AVX-512: 16 lanes x 2 (FMA) x FMA units)."""
    return cores * ghz * flop_per_cycle


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--images", type=int, default=64, help="images per round (a multiple of 2 x batch)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cores", type=int, default=2, help="Spark local[N], and threads for (b)")
    p.add_argument("--ghz", type=float, default=2.5)
    p.add_argument("--flop-per-cycle", type=int, default=64, help="fp32 FLOP/cycle/core (AVX-512, 2 FMA units: 64)")
    p.add_argument("--only", choices=["spark", "openvino", "udf"], default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    setup_env(onednn=True)
    print(banner(), flush=True)
    ceilings = matmul_ceilings()
    print(ceilings_line(ceilings), flush=True)

    import keras
    import numpy as np

    from optim import TFPredictor
    from tfnet import TFNet

    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, input_shape=(args.size, args.size, 3))
    net = TFNet.from_keras(model)
    x = np.random.default_rng(0).uniform(-1, 1, (args.images, args.size, args.size, 3)).astype("float32")
    results = {"machine": machine(), "batch": args.batch, "size": args.size, "images_per_round": args.images,
               "rounds": args.rounds, "ceilings": ceilings,
               "command": "python benchmarks/bench_predictor.py " + " ".join(sys.argv[1:] if argv is None else argv)}

    if args.only in (None, "spark"):
        spark = spark_session(args.cores)
        df = image_frame(spark, x, args.cores)
        predictor = TFPredictor(net, batch_per_thread=args.batch)

        def over_spark():
            predictor.predict(df, feature_cols="image").write.format("noop").mode("overwrite").save()

        def single_process():
            net.forward(x, batch_size=args.batch)

        times = interleaved({"spark": over_spark, "single": single_process}, args.rounds)
        t_spark, t_single = median(times["spark"]), median(times["single"])
        stats = predictor.stats()
        results["spark"] = {
            "tfpredictor_img_s": args.images / t_spark, "single_process_img_s": args.images / t_single,
            "ratio": t_single / t_spark, "ratio_best": min(times["single"]) / min(times["spark"]),
            "model_loads_per_worker": stats["loads"], "model_calls": stats["calls"], "times": times,
        }
        print(f"(a) TFPredictor on Spark local[{args.cores}] {args.images / t_spark:6.2f} img/s   single-process "
              f"net.forward {args.images / t_single:6.2f} img/s   ratio {t_single / t_spark:.2f}  (target >= 0.9)")
        print(f"    model loads per Python worker: {stats['loads']}; model calls: {stats['calls']}")
        predictor.close()
        spark.stop()

    if args.only in (None, "openvino"):
        threads = args.cores
        tf_side = TFPredictor(net, batch_per_thread=args.batch)  # TF: its default pools (one per core)
        ov_side = TFPredictor(net, batch_per_thread=args.batch, backend="openvino", num_threads=threads)
        diff = float(np.abs(ov_side.predict(x[:args.batch]) - tf_side.predict(x[:args.batch])).max())
        times = interleaved({"openvino": lambda: ov_side.predict(x), "tensorflow": lambda: tf_side.predict(x)},
                            args.rounds)
        t_ov, t_tf = median(times["openvino"]), median(times["tensorflow"])
        import tensorflow as tf

        peak = fp32_peak(args.cores, args.ghz, args.flop_per_cycle)
        ov_gflops = args.images / t_ov * resnet50_gflop(args.size)
        matmul = ceilings["fp32_gflops"]
        results["openvino"] = {
            "openvino_img_s": args.images / t_ov, "tensorflow_img_s": args.images / t_tf,
            "ratio": t_tf / t_ov, "ratio_best": min(times["tensorflow"]) / min(times["openvino"]),
            "max_abs_diff": diff,
            "tf_intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads() or "default",
            "openvino_threads": threads, "fp32_peak_gflops": peak,
            "peak_assumption": f"{args.cores} cores x {args.ghz} GHz x {args.flop_per_cycle} FLOP/cycle",
            "openvino_gflops": ov_gflops, "openvino_share_of_peak": ov_gflops / peak,
            "openvino_share_of_peak_one_fma_unit": ov_gflops / (peak / 2),
            "tf_matmul_gflops": matmul, "times": times,
        }
        print(f"(b) OpenVINO {args.images / t_ov:6.2f} img/s   TensorFlow {args.images / t_tf:6.2f} img/s   "
              f"ratio {t_tf / t_ov:.2f}  (target >= 1.15); max |OV - TF| = {diff:.2e}")
        print(f"    OpenVINO: {ov_gflops:.0f} GFLOP/s = {100 * ov_gflops / peak:.0f}% of {peak:.0f} GFLOP/s "
              f"({results['openvino']['peak_assumption']}), {200 * ov_gflops / peak:.0f}% if one FMA unit; "
              f"TF 2048^2 matmul: {matmul:.0f} GFLOP/s")
    if args.only in (None, "udf"):
        results["udf"] = against_predict_batch_udf(args, net, model, x, ceilings)
    print(f"machine: {results['machine']}")
    finish(args.json, results)
    return results


if __name__ == "__main__":
    main()
