"""TFPredictor on ResNet-50 (224x224, batch 16), oneDNN on for TensorFlow.

(a) TFPredictor over Spark local[2] (two Python workers, one thread each, the model cached in
    each) against a plain single-process TF predict loop (``net.forward`` on 16 rows at a time,
    TensorFlow's default 2 threads) on the same images. Target ratio >= 0.9.
(b) The OpenVINO backend against the TensorFlow backend, both through TFPredictor's local path in
    this process, with the same threads (2) and batch. Target ratio >= 1.15. Also reported: the
    OpenVINO backend's share of the CPU's fp32 peak, and its largest difference from TensorFlow.

Both sides of each comparison run in this one process run, in alternation, after a warm-up; the
median time per round gives the ratio.

    python benchmarks/bench_predictor.py [--images 64] [--rounds 5] [--threads 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import banner, interleaved, machine, matmul_ceilings, median, setup_env, write_json  # noqa: E402

GFLOP_PER_IMAGE = 8.2  # ResNet-50 forward at 224x224: about 4.1 GMACs


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
    p.add_argument("--only", choices=["spark", "openvino"], default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    setup_env(onednn=True)
    print(banner(), flush=True)

    import keras
    import numpy as np

    from optim import TFPredictor
    from tfnet import TFNet

    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, input_shape=(args.size, args.size, 3))
    net = TFNet.from_keras(model)
    del model
    x = np.random.default_rng(0).uniform(-1, 1, (args.images, args.size, args.size, 3)).astype("float32")
    results = {"machine": machine(), "batch": args.batch, "size": args.size, "images_per_round": args.images,
               "rounds": args.rounds}

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
        ov_gflops = args.images / t_ov * GFLOP_PER_IMAGE
        matmul = matmul_ceilings()["fp32_gflops"]
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
    print(f"machine: {results['machine']}")
    write_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
