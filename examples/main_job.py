"""The main job (`make run`): what tfnet does, end to end, on real data, in a few minutes on 2 cores.

1. Pretrain a small CNN on digits 0-4 of scikit-learn's digits (one process, TFOptimizer).
2. Freeze it to a frozen graph file (.pb).
3. Load the graph as a TFNet, cut it at its features, add a new head for digits 5-9, and
   fine-tune it over 2 Horovod ranks in one Spark barrier stage (an embedded local Spark).
4. Evaluate it on held-out digits.
5. Score a Spark DataFrame of held-out digits with TFPredictor, in fp32 and OpenVINO INT8.
6. Save the fine-tuned frozen graph, reload it, and check it gives the same outputs.

    python -m examples.main_job [--out runs/main] [--workers 2] [--epochs 8]
    python -m examples.main_job --resnet50 [train.py arguments...]   # the ResNet-50 benchmark instead

`make run` runs the first; `make run RUN_ARGS=--resnet50` the second (by default a short synthetic
run: 2 ranks, 224x224, batch 16, 4 steps, with the 1-rank run for the scaling efficiency).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

RESNET50_DEFAULTS = ["--mode", "train", "--synthetic", "--num-workers", "2", "--batch-size", "16",
                     "--steps-per-epoch", "4", "--epochs", "1", "--scaling", "--output", "runs/resnet50"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="tfnet-main", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/main", help="where the graphs, checkpoints and TensorBoard events go")
    p.add_argument("--workers", type=int, default=2, help="Horovod ranks for the fine-tuning")
    p.add_argument("--pretrain-epochs", type=int, default=8)
    p.add_argument("--epochs", type=int, default=8, help="fine-tuning epochs")
    p.add_argument("--batch-size", type=int, default=32, help="global batch")
    p.add_argument("--master", default="local[2]", help="Spark master (default: an embedded local[2])")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--verbose", action="store_true",
                   help="also show TensorFlow's and Spark's own log lines (as TFNET_VERBOSE=1 does)")
    p.add_argument("--resnet50", action="store_true",
                   help="run the ResNet-50 benchmark (examples/resnet50/train.py) instead; later arguments go to it")
    return p.parse_known_args(argv)


def run_resnet50(extra: list[str]) -> dict:
    from .resnet50 import train

    given = {a for a in extra if a.startswith("--")}
    args = list(extra)
    # the defaults, unless the user set them (a flag and its value are dropped together)
    i = 0
    while i < len(RESNET50_DEFAULTS):
        flag = RESNET50_DEFAULTS[i]
        has_value = i + 1 < len(RESNET50_DEFAULTS) and not RESNET50_DEFAULTS[i + 1].startswith("--")
        if flag not in given and not (flag == "--synthetic" and "--data-format" in given):
            args += RESNET50_DEFAULTS[i:i + 2] if has_value else [flag]
        i += 2 if has_value else 1
    print("tfnet-resnet50 " + " ".join(args), flush=True)
    return train.main(args)


def _spark(master: str, verbose: int = 1):
    """(session, created): the active session if there is one, else an embedded one on ``master``."""
    from pyspark.sql import SparkSession

    from optim.spark.session import build_session

    if SparkSession.getActiveSession() is not None:
        return SparkSession.getActiveSession(), False
    return build_session("tfnet-main", master, {"spark.driver.memory": "3g", "spark.sql.shuffle.partitions": "4"},
                         verbose=verbose), True


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--resnet50" in argv:  # everything after it belongs to the ResNet-50 script
        return run_resnet50(argv[argv.index("--resnet50") + 1:])
    args, extra = parse_args(argv)
    if extra:
        raise SystemExit(f"unknown arguments {extra} (arguments after --resnet50 go to the ResNet-50 script)")

    import logging
    import re

    from optim.logs import configure, import_tensorflow

    verbose = 0 if args.quiet else 2 if args.verbose else 1
    # An application configures logging (the logging HOWTO): one console handler, on the root logger, for
    # every library's lines; tfnet's go through it, once each, at the level configure() sets.
    logging.basicConfig(format="%(message)s")
    configure(verbose)
    import_tensorflow()  # before keras: keeps TensorFlow's start-up banner out of the console

    import keras
    import numpy as np

    import optim
    from optim import TFDataset, TFOptimizer, TFPredictor
    from tfnet import TFNet

    from .digits import cnn, load, split

    os.makedirs(args.out, exist_ok=True)
    t_start = time.time()
    summary: dict = {}
    sce = optim.losses.SparseCategoricalCrossentropy(from_logits=True)

    def stage(k: int, text: str) -> None:
        print(f"\n[{k}/6] {text}  (+{time.time() - t_start:.0f} s)", flush=True)

    # The Spark session first: its workers import TensorFlow in the background (tfnet starts that
    # when it creates or finds a session) while this process pretrains.
    spark, own_spark = _spark(args.master, verbose)

    # 1. Pretrain on digits 0-4.
    stage(1, "pretrain a small CNN on digits 0-4, in this process")
    x0, y0 = load(range(5))
    base = cnn(classes=5)
    base.compile(optimizer=keras.optimizers.Adam(0.01),
                 loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    pre = TFOptimizer.from_keras(base)
    hist = pre.optimize((x0, y0), epochs=args.pretrain_epochs, batch_size=32, verbose=verbose)
    summary["pretrain accuracy (digits 0-4, train)"] = hist["accuracy"][-1]

    # 2. Freeze to a graph file.
    pb = os.path.join(args.out, "pretrained_digits.pb")
    with open(pb, "wb") as f:
        f.write(pre.net.frozen_graph_def().SerializeToString())
    stage(2, f"froze it to {pb} ({os.path.getsize(pb):,} bytes)")

    # 3. New head, distributed fine-tuning over Spark.
    stage(3, f"fine-tune on digits 5-9 with a new head: {args.workers} Horovod ranks in one Spark barrier stage")
    body = TFNet.from_frozen_graph(pb, inputs="image", outputs="logits").cut("features")
    keras.utils.set_random_seed(1)
    net = body.add_head(keras.layers.Dense(5, name="digit"), name="head")
    print(f"      {net}")
    (xtr, ytr), (xte, yte) = split(*load(range(5, 10)))
    ytr, yte = ytr - 5, yte - 5
    train_df = spark.createDataFrame(
        [(xtr[i].ravel().tolist(), int(ytr[i])) for i in range(len(xtr))], "pixels array<float>, label long"
    ).repartition(args.workers)
    data = TFDataset.from_dataframe(train_df, "pixels", "label", feature_shapes={"pixels": (8, 8, 1)})
    # the new head learns fast, the pretrained body slowly
    methods = {"head/": optim.Adam(0.01), re.compile("^(?!head/)"): optim.Adam(0.002)}
    opt = TFOptimizer(net, sce, methods, metrics=["accuracy"], model_dir=os.path.join(args.out, "model"))
    before = float(np.mean(net.forward(xte).argmax(1) == yte))
    history = opt.optimize(data, epochs=args.epochs, batch_size=args.batch_size, validation_data=(xte, yte),
                           num_workers=args.workers, verbose=verbose)
    run = opt.last_run
    summary["ranks"] = run["num_workers"]
    summary["fine-tune steps"] = opt.global_step
    if run.get("startup_s"):
        summary["start-up to first step (s)"] = run["startup_s"]
    steps = [t for t in run.get("step_times") or [] if t]
    if steps:
        summary["median step (ms)"] = 1000 * float(np.median(steps))

    # 4. Evaluate.
    stage(4, "evaluate on held-out digits 5-9")
    scores = opt.evaluate((xte, yte))
    summary["accuracy before fine-tuning (new head)"] = before
    summary["accuracy after fine-tuning"] = scores["accuracy"]
    print(f"      loss {scores['loss']:.4f}  accuracy {scores['accuracy']:.4f}  "
          f"(validation accuracy by epoch: {', '.join(f'{a:.3f}' for a in history['val_accuracy'])})")

    # 5. TFPredictor on a DataFrame.
    stage(5, "score a Spark DataFrame of held-out digits with TFPredictor")
    test_df = spark.createDataFrame(
        [(i, int(yte[i]), xte[i].ravel().tolist()) for i in range(len(xte))], "id long, label long, pixels array<float>"
    ).repartition(2)
    with TFPredictor(opt.net, batch_per_thread=64) as predictor:
        scored = predictor.predict(test_df, feature_cols="pixels", output_cols="logits")
        rows, first_s, seconds = _timed_passes(lambda: scored.select("id", "label", "logits").collect())
        rows = sorted(rows, key=lambda r: r.id)
        stats = predictor.stats()
    for r in rows[:3]:
        print(f"      id {r.id:3d}  label {r.label}  logits [{', '.join(f'{v:.3f}' for v in r.logits)}]")
    logits = np.array([r.logits for r in rows], np.float32)
    labels = np.array([r.label for r in rows])
    same = np.allclose(logits, opt.net.forward(xte), rtol=1e-5, atol=1e-5)
    summary["TFPredictor accuracy (DataFrame)"] = float(np.mean(logits.argmax(1) == labels))
    summary["TFPredictor rows/s (warm: a second pass)"] = len(rows) / seconds
    print(f"      {len(rows)} rows in {first_s:.1f} s (first pass: the model broadcast and loaded), {seconds:.2f} s "
          f"warm; {stats['calls']} model calls, model loaded {sum(stats['loads'].values())}x "
          f"({len(stats['loads'])} Python workers); equals net.forward: {same}")
    if not same:
        raise SystemExit("TFPredictor's outputs differ from net.forward")
    summary["fp32 / INT8 accuracy, rows/s warm (DataFrame)"] = _int8_line(
        opt.net, train_df, test_df, summary["TFPredictor accuracy (DataFrame)"], len(rows) / seconds)

    # 6. Save the fine-tuned frozen graph, and check it.
    folder = os.path.join(args.out, "fine_tuned")
    opt.net.save(folder)
    again = TFNet.load(folder)
    graph = os.path.join(folder, "frozen_inference_graph.pb")
    identical = bool(np.array_equal(again.forward(xte), opt.net.forward(xte)))
    stage(6, f"saved the fine-tuned frozen graph to {graph} ({os.path.getsize(graph):,} bytes); "
             f"reloaded, identical outputs: {identical}")
    if not identical:
        raise SystemExit("the reloaded graph differs from the fine-tuned net")
    if own_spark:
        spark.stop()

    summary["wall time (s)"] = time.time() - t_start
    print("\nSummary")
    width = max(len(k) for k in summary)
    for k, v in summary.items():
        print(f"  {k:<{width}}  {v:.4g}" if isinstance(v, float) else f"  {k:<{width}}  {v}")
    return summary


def _timed_passes(action):
    """Runs ``action`` (a Spark action) twice: ``(its result, the first pass's seconds, the second's)``. The
    first pays the start-up (the model broadcast, loaded in each Python worker); the second is warm, and
    is what throughputs are compared on."""
    t0 = time.time()
    action()
    first = time.time() - t0
    t0 = time.time()
    result = action()
    return result, first, time.time() - t0


def _int8_line(net, train_df, test_df, fp32_accuracy: float, fp32_rows_s: float) -> str:
    """The same DataFrame scored by OpenVINO INT8 (NNCF, calibrated on 300 training rows sampled on
    the driver), timed as fp32 was (a warm second pass): ``"fp32 acc / INT8 acc, fp32 rows/s / INT8 rows/s"``."""
    import numpy as np

    from optim import TFPredictor
    from optim.errors import BackendUnavailableError

    try:
        t0 = time.time()
        predictor = TFPredictor(net, batch_per_thread=64, backend="openvino", precision="int8",
                                calibration=train_df, calibration_cols="pixels")
        quantise_s = time.time() - t0
    except BackendUnavailableError as exc:  # openvino or nncf not installed
        print(f"      INT8 skipped: {exc}")
        return "INT8 skipped (pip install tfnet[quantize])"
    with predictor:
        scored = predictor.predict(test_df, feature_cols="pixels", output_cols="logits").select("label", "logits")
        rows, first_s, seconds = _timed_passes(scored.collect)
        stats = predictor.stats()
    accuracy = float(np.mean(np.array([r.logits for r in rows]).argmax(1) == np.array([r.label for r in rows])))
    print(f"      INT8 (OpenVINO, quantised once in {quantise_s:.1f} s, loaded {sum(stats['loads'].values())}x): "
          f"accuracy {accuracy:.4f} against fp32 {fp32_accuracy:.4f}; {first_s:.1f} s first pass, "
          f"{len(rows) / seconds:.0f} rows/s warm against fp32's {fp32_rows_s:.0f}")
    return f"{fp32_accuracy:.4f} / {accuracy:.4f}, {fp32_rows_s:.0f} / {len(rows) / seconds:.0f}"


def cli() -> None:
    """The console script: ``main`` without its return value (which would become the exit code)."""
    main()


if __name__ == "__main__":
    cli()
