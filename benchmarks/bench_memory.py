"""Peak memory of a training rank against the rows of its partition, streamed against in memory (issue 36).

Spark ``local[2]``, two Horovod ranks, one epoch of a small CNN over a DataFrame of PNG-encoded 64x64x3
images made by Spark (random pixels seeded by the row id, about 12 KB each). Each rank records its Python
worker's peak RSS (``VmHWM``, reset when its task starts) in ``model_dir/ranks/<run>/rank-N.json``; this
prints the larger of the two ranks' peaks for each row count and path, and the decoded float32 size of a
rank's partition (what the in-memory path holds at once, before its copies).

    PYTHONPATH=. python benchmarks/bench_memory.py [--rows 4000,16000,64000] [--in-memory-up-to 16000]
                                                   [--json out.json]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import banner, finish, machine, setup_env  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout, for tests/
from tests.spark_utils import png_frame  # noqa: E402,F401 (bench_input.py takes it from here too)

SIZE = 64


def spark_session(cores: int = 2):
    from optim.spark.session import build_session

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    tmp = tempfile.mkdtemp(prefix="tfnet-bench-")
    return build_session("bench-streaming", f"local[{cores}]", {
        "spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1", "spark.local.dir": tmp,
        "spark.driver.memory": "4g", "spark.python.worker.reuse": "true"})


def small_cnn(size: int = SIZE):
    import keras

    from tfnet import TFNet

    keras.utils.set_random_seed(0)
    return TFNet.from_keras(keras.Sequential([
        keras.Input((size, size, 3), name="image"), keras.layers.Rescaling(1 / 255.0),
        keras.layers.Conv2D(8, 3, strides=2, activation="relu"), keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10, name="logits")]))


def rank_infos(model_dir: str) -> list[dict]:
    out = []
    for path in glob.glob(os.path.join(model_dir, "ranks", "*", "rank-*.json")):
        with open(path) as f:
            out.append(json.load(f))
    return out


def one_run(spark, rows: int, streaming: bool, root: str) -> dict:
    import optim
    from optim import TFDataset, TFOptimizer

    model_dir = os.path.join(root, f"{rows}-{'stream' if streaming else 'memory'}")
    data = TFDataset.from_dataframe(png_frame(spark, rows), "image", "label", feature_shapes={"image": (SIZE, SIZE, 3)},
                                    streaming=streaming)
    opt = TFOptimizer(small_cnn(), optim.losses.SparseCategoricalCrossentropy(from_logits=True), optim.SGD(0.01),
                      model_dir=model_dir)
    t0 = time.perf_counter()
    opt.optimize(data, epochs=1, batch_size=64, num_workers=2, verbose=0)
    wall = time.perf_counter() - t0
    infos = rank_infos(model_dir)
    peak = max(i["peak_rss_bytes"] for i in infos)
    return {"rows": rows, "streaming": streaming, "peak_rss_mib": peak / 2**20, "wall_s": wall,
            "rows_per_rank": opt.last_run["rows"],
            "local_copy_mib": sum(i.get("local_copy_bytes", 0) for i in infos) / 2**20 / max(len(infos), 1)}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="4000,16000,64000")
    p.add_argument("--in-memory-up-to", type=int, default=16000, help="largest row count run in memory too")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    setup_env(onednn=True)
    print(banner(), flush=True)
    spark = spark_session(2)
    root = tempfile.mkdtemp(prefix="tfnet-bench-memory-")
    results = {"machine": machine(), "command": "python benchmarks/bench_memory.py " + " ".join(
        sys.argv[1:] if argv is None else argv), "runs": []}
    print(f"{'rows':>7} {'rows/rank':>9} {'decoded/rank':>12} {'streamed peak':>14} {'in-memory peak':>15} "
          f"{'local copy/rank':>15} {'wall s (stream / memory)':>25}", flush=True)
    base = None
    for rows in [int(r) for r in args.rows.split(",")]:
        streamed = one_run(spark, rows, True, root)
        memory = one_run(spark, rows, False, root) if rows <= args.in_memory_up_to else None
        results["runs"] += [r for r in (streamed, memory) if r]
        decoded = rows / 2 * SIZE * SIZE * 3 * 4 / 2**20
        base = base or streamed["peak_rss_mib"]
        mem = f"{memory['peak_rss_mib']:9.0f} MiB" if memory else f"{'-':>13}"
        walls = f"{streamed['wall_s']:.1f} / {memory['wall_s']:.1f}" if memory else f"{streamed['wall_s']:.1f} / -"
        print(f"{rows:>7} {rows // 2:>9} {decoded:>8.0f} MiB {streamed['peak_rss_mib']:>10.0f} MiB {mem:>15} "
              f"{streamed['local_copy_mib']:>11.1f} MiB {walls:>25}   streamed peak / first: "
              f"{streamed['peak_rss_mib'] / base:.3f}", flush=True)
    spark.stop()
    finish(args.json, results)
    return results


if __name__ == "__main__":
    main()
