"""Does the input keep up with the step? Training throughput with the partition in memory, streamed (epoch 1
and epoch 2) and read from Parquet by the ranks, side by side on the same data and model (issue 36).

Spark ``local[2]``, two Horovod ranks of one thread, ``--rows`` PNG-encoded 64x64x3 images (made by Spark,
written once to Parquet; the DataFrame paths read that Parquet through Spark, ``from_parquet`` reads it
from the ranks), ``--epochs`` epochs of ``--model`` at a global batch of 32. For each path it prints:

* img/s of the steps of each epoch (the global batch over the time from one step's end to the next, which
  includes any wait for input; the first step of each epoch, the compile's, is left out);
* the start-up (``optimize()`` to the first step: Spark's read of the partition, and for the in-memory path
  the decode of all of it; for the streamed paths the local copy);
* the wall time of the whole call, and images per second of it (rows x epochs / wall).

A streamed rank reads its local copy in every epoch (the copy is made before the first step, while the
ranks agree on the steps), so epoch 1 and epoch 2 both stream from local disk.

    PYTHONPATH=. python benchmarks/bench_input.py [--rows 2000] [--epochs 2] [--model resnet50|small]
                                                  [--rounds 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_memory import SIZE, png_frame, small_cnn, spark_session  # noqa: E402
from common import banner, finish, machine, setup_env  # noqa: E402

BATCH = 32


def model(name: str):
    import keras

    from tfnet import TFNet

    if name == "small":
        return small_cnn()
    keras.utils.set_random_seed(0)
    return TFNet.from_keras(keras.applications.ResNet50(weights=None, input_shape=(SIZE, SIZE, 3), classes=10,
                                                        classifier_activation=None))


def epoch_rates(step_times: list, steps_per_epoch: int, epochs: int) -> list[float]:
    """img/s of each epoch's steps, the first step of each epoch left out."""
    rates = []
    for e in range(epochs):
        times = [t for t in step_times[e * steps_per_epoch + 1:(e + 1) * steps_per_epoch] if t is not None]
        rates.append(BATCH * len(times) / sum(times) if times else float("nan"))
    return rates


def one_run(spark, path: str, data_path: str, args) -> dict:
    import optim
    from optim import TFDataset, TFOptimizer

    shapes = {"image": (SIZE, SIZE, 3)}
    if path == "parquet":
        data = TFDataset.from_parquet(data_path, "image", "label", feature_shapes=shapes)
    else:
        df = spark.read.parquet(data_path).repartition(2)
        data = TFDataset.from_dataframe(df, "image", "label", feature_shapes=shapes, streaming=path == "streamed")
    lr = 0.01 if args.model == "small" else 1e-4  # an untrained ResNet-50 on 0-255 pixels diverges at 0.01
    opt = TFOptimizer(model(args.model), optim.losses.SparseCategoricalCrossentropy(from_logits=True), optim.SGD(lr))
    t0 = time.perf_counter()
    # a throughput benchmark: an untrained ResNet-50 on raw 0-255 pixels of random images can reach a
    # non-finite loss within a few steps; such a step is computed in full and then not applied
    opt.optimize(data, epochs=args.epochs, batch_size=BATCH, num_workers=2, verbose=0, on_nonfinite="skip")
    wall = time.perf_counter() - t0
    run = opt.last_run
    rates = epoch_rates(run["step_times"], run["steps_per_epoch"], args.epochs)
    return {"path": path, "epoch_img_s": rates, "startup_s": run["startup_s"], "wall_s": wall,
            "overall_img_s": args.rows * args.epochs / wall, "steps_per_epoch": run["steps_per_epoch"]}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--model", choices=["resnet50", "small"], default="resnet50")
    p.add_argument("--rounds", type=int, default=1, help="rounds of the paths, in alternating order")
    p.add_argument("--paths", default="memory,streamed,parquet", help="which paths, comma-separated")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    setup_env(onednn=True)
    print(banner(), flush=True)
    print(f"# {args.rows} PNG rows of {SIZE}x{SIZE}x3 over 2 ranks, {args.epochs} epochs of {args.model}, global batch "
          f"{BATCH}", flush=True)
    spark = spark_session(2)
    data_path = os.path.join(tempfile.mkdtemp(prefix="tfnet-bench-input-"), "images")
    png_frame(spark, args.rows).write.option("parquet.block.size", 4 << 20).parquet(data_path)
    paths = [q for q in ("memory", "streamed", "parquet") if q in args.paths.split(",")]
    runs: dict[str, list] = {k: [] for k in paths}
    for r in range(args.rounds):
        for path in (paths if r % 2 == 0 else paths[::-1]):
            out = one_run(spark, path, data_path, args)
            runs[path].append(out)
            print(f"  round {r + 1} {path:>8}: " + "  ".join(f"epoch {e + 1} {v:7.1f} img/s" for e, v in
                                                           enumerate(out["epoch_img_s"]))
                  + f"   start-up {out['startup_s']:.1f} s   wall {out['wall_s']:.1f} s "
                    f"({out['overall_img_s']:.1f} img/s overall)", flush=True)
    spark.stop()

    def med(path, key, e=None):
        values = [o[key][e] if e is not None else o[key] for o in runs[path]]
        return statistics.median(values)

    mem1, mem2 = med("memory", "epoch_img_s", 0), med("memory", "epoch_img_s", -1)
    st1, st2 = med("streamed", "epoch_img_s", 0), med("streamed", "epoch_img_s", -1)
    ratios = {"streamed_epoch1_vs_memory": st1 / mem1, "streamed_epoch2_vs_memory": st2 / mem2,
              "streamed_epoch2_vs_epoch1": st2 / st1,
              "streamed_overall_vs_memory": med("streamed", "overall_img_s") / med("memory", "overall_img_s")}
    # the same epoch of the two paths in the same round, paired: this machine's slow spells hit a round's paths alike
    paired = {f"epoch {e + 1}": statistics.median(s["epoch_img_s"][e] / m["epoch_img_s"][e]
                                                  for s, m in zip(runs["streamed"], runs["memory"]))
              for e in range(args.epochs)}
    print(f"steps, img/s (median of {args.rounds}): in memory {mem1:.1f} / {mem2:.1f}, streamed epoch 1 {st1:.1f}, "
          f"epoch {args.epochs} {st2:.1f}")
    print(f"streamed / in memory: epoch 1 {ratios['streamed_epoch1_vs_memory']:.3f}, epoch {args.epochs} "
          f"{ratios['streamed_epoch2_vs_memory']:.3f} (target >= 0.95); streamed epoch {args.epochs} / epoch 1 "
          f"{ratios['streamed_epoch2_vs_epoch1']:.3f} (target >= 1); whole call, streamed / in memory "
          f"{ratios['streamed_overall_vs_memory']:.3f}")
    print("streamed / in memory, paired within each round (median of the rounds): "
          + ", ".join(f"{k} {v:.3f}" for k, v in paired.items()))
    if runs.get("parquet"):
        pq1 = med("parquet", "epoch_img_s", 0)
        ratios.update({"parquet_epoch1_vs_memory": pq1 / mem1,
                       "parquet_overall_vs_memory": med("parquet", "overall_img_s") / med("memory", "overall_img_s")})
        print(f"from_parquet epoch 1 {pq1:.1f} img/s: {ratios['parquet_epoch1_vs_memory']:.3f} of in memory; whole call "
              f"{ratios['parquet_overall_vs_memory']:.3f}")
    results = {"machine": machine(), "command": "python benchmarks/bench_input.py " + " ".join(
        sys.argv[1:] if argv is None else argv), "args": vars(args), "runs": runs, "ratios": ratios, "paired": paired}
    finish(args.json, results)
    return results


if __name__ == "__main__":
    main()
