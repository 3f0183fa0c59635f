"""ResNet-50 on ImageNet-style data with tfnet.

Modes:
  train      fine-tune over Spark with Horovod (epochs, batch, a schedule with warm-up, checkpoints),
             then evaluate; --scaling also runs one rank to report the scaling efficiency
  evaluate   top-1 and top-5 of a model on the validation split
  inference  inference throughput (TensorFlow, and OpenVINO with --backend openvino)
  compare    the same fine-tuning through tfnet and through native Keras `fit`, side by side

Data: --data-format tfrecord (train-00000-of-01024 shards with image/encoded and
image/class/label), jpeg (a folder per class), or synthetic (random tensors, no I/O).

    python -m examples.resnet50.train --mode train --synthetic --num-workers 2 --epochs 1
    tfnet-resnet50 --mode train --data-format tfrecord --data-dir /data/imagenet --master spark://host:7077

Results go to --output: results.json, results.txt and curves.png.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tfnet-resnet50", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["train", "evaluate", "inference", "compare"], default="train")
    p.add_argument("--data-format", choices=["tfrecord", "jpeg", "synthetic"], default=None)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--synthetic", action="store_true", help="random tensors, no I/O (same as --data-format synthetic)")
    p.add_argument("--label-offset", type=int, default=0,
                   help="subtracted from image/class/label (1 for the Inception scripts' 1-based labels)")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--classes", type=int, default=None, help="default: the folder count (jpeg) or 1000")
    p.add_argument("--frozen-graph", default=None, help="a frozen ResNet .pb instead of Keras ResNet50(weights=None)")
    p.add_argument("--input-name", default="input_1")
    p.add_argument("--output-name", default="predictions")
    p.add_argument("--from-logits", action="store_true", help="the frozen graph's output is logits")
    p.add_argument("--master", default=None, help="Spark master; default: the active session or local[*]")
    p.add_argument("--num-workers", type=int, default=None)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32, help="global batch")
    p.add_argument("--steps-per-epoch", type=int, default=None, help="synthetic data: batches per epoch per rank")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=1e-4, help="L2 added to the gradient")
    p.add_argument("--schedule", choices=["cosine", "step", "constant"], default="cosine")
    p.add_argument("--warmup-epochs", type=float, default=0.0)
    p.add_argument("--optimizer", choices=["sgd", "lars"], default="sgd")
    p.add_argument("--model-dir", default=None, help="checkpoints and TensorBoard events")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--checkpoint-every", type=int, default=None)
    p.add_argument("--scaling", action="store_true", help="also train on one rank to report scaling efficiency")
    p.add_argument("--backend", choices=["tensorflow", "openvino"], default="tensorflow")
    p.add_argument("--eval-batches", type=int, default=None, help="limit evaluation to N batches")
    p.add_argument("--output", default="runs/resnet50")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--verbose", type=int, default=1)
    args = p.parse_args(argv)
    if args.synthetic:
        args.data_format = "synthetic"
    if args.data_format is None:
        p.error("choose the data: --data-format tfrecord|jpeg with --data-dir, or --synthetic")
    if args.data_format != "synthetic" and not args.data_dir:
        p.error(f"--data-format {args.data_format} needs --data-dir")
    return args


def _spark(master: str | None):
    from optim.spark.session import build_session

    return build_session("tfnet-resnet50", master, {"spark.driver.memory": "6g", "spark.driver.maxResultSize": "2g"})


def build_net(args, classes: int):
    from tfnet import TFNet

    if args.frozen_graph:
        return TFNet.from_frozen_graph(args.frozen_graph, args.input_name, args.output_name), args.from_logits
    import keras

    keras.utils.set_random_seed(args.seed)
    model = keras.applications.ResNet50(weights=None, input_shape=(args.image_size, args.image_size, 3),
                                        classes=classes, classifier_activation=None)
    # from scratch, its batch norms train as Keras's fit trains them (the batch's statistics, the moving ones updated)
    return TFNet.from_keras(model, train_batch_norm=True), True


def _method(args, steps_per_epoch: int):
    import optim
    from optim import schedules as S

    total = max(1, args.epochs * steps_per_epoch)
    warm = int(args.warmup_epochs * steps_per_epoch)
    decay = max(1, total - warm)
    if args.schedule == "cosine":
        lr = S.cosine(args.lr, decay)
    elif args.schedule == "step":
        lr = S.step_decay(args.lr, max(1, decay // 3), 0.1)
    else:
        lr = S.constant(args.lr)
    if warm:
        lr = S.warmup(lr, warm)
    if args.optimizer == "lars":
        return optim.LARS(lr, momentum=args.momentum, weight_decay=args.weight_decay)
    return optim.SGD(lr, momentum=args.momentum, l2=args.weight_decay or None)


def _source(args):
    from .data import Source, count_classes

    src = Source(args.data_format, args.data_dir, args.image_size, args.classes or 1000, args.label_offset,
                 args.steps_per_epoch or 8)
    classes = args.classes or count_classes(src)
    return Source(src.kind, src.data_dir, src.image_size, classes, src.label_offset, src.synthetic_batches), classes


def _train_input(src, per_rank_batch: int, seed: int):
    from optim import TFDataset

    from .data import make_dataset

    def per_rank(rank, size):
        return make_dataset(src, "train", rank=rank, size=size, batch=per_rank_batch, training=True, seed=seed)

    return TFDataset.from_tf_data(per_rank)


def _steps_per_epoch(args, src, n: int, per_rank: int) -> int:
    """Steps per epoch: given, or from the image count (JPEG tree; TFRecords are counted once)."""
    if args.steps_per_epoch:
        return args.steps_per_epoch
    if src.kind == "synthetic":
        return src.synthetic_batches
    if src.kind == "jpeg":
        from .data import jpeg_tree

        images = len(jpeg_tree(src.data_dir, "train")[0])
    else:
        import tensorflow as tf

        from .data import tfrecord_files

        print("counting TFRecord examples once (pass --steps-per-epoch to skip this)", file=sys.stderr)
        images = int(tf.data.TFRecordDataset(tfrecord_files(src.data_dir, "train")).reduce(0, lambda c, _: c + 1))
    return max(1, images // n // per_rank)


def _throughput(step_times, batch: int) -> tuple[float, float]:
    """The steady throughput: ``batch`` over the median step time, the first steps (the compile,
    warm-up) left out. Returns (images per second, seconds per step)."""
    times = [t for t in step_times if t]
    steady = times[2:] if len(times) > 4 else times[1:] or times
    step = statistics.median(steady) if steady else float("nan")
    return batch / step, step


def _bar_throughput(step_times, batch: int, steps_per_epoch: int) -> list[float]:
    """What the progress bar's ``samples_per_sec`` shows at the end of each epoch: the epoch's
    images over the seconds since the epoch began (each step's time runs from the end of the one
    before, so they add up to that), the first step's compile included in the first epoch. The
    epochs are counted from the end (a resumed run's first epoch may be a part of one)."""
    times = [t or 0.0 for t in step_times]
    chunks = []
    while times:
        chunks.insert(0, times[-steps_per_epoch:])
        times = times[:-steps_per_epoch]
    return [batch * len(c) / sum(c) if sum(c) else float("nan") for c in chunks]


def train_mode(args, spark, results: dict) -> None:
    import optim
    from optim import TFOptimizer

    src, classes = _source(args)
    n = args.num_workers or spark.sparkContext.defaultParallelism
    if args.batch_size % n:
        raise SystemExit(f"--batch-size {args.batch_size} must split evenly over {n} workers")
    per_rank = args.batch_size // n
    optim.warm_up_workers(spark, n)  # the workers import TensorFlow while the driver builds the model
    steps = _steps_per_epoch(args, src, n, per_rank)
    net, logits = build_net(args, classes)
    loss = optim.losses.SparseCategoricalCrossentropy(from_logits=logits)
    steps_hint = steps
    opt = TFOptimizer(net, loss, _method(args, steps_hint), metrics=["accuracy", "top5_accuracy"],
                      model_dir=args.model_dir)
    t0 = time.time()
    history = opt.optimize(_train_input(src, per_rank, args.seed), epochs=args.epochs, num_workers=n,
                           resume=args.resume, checkpoint_every=args.checkpoint_every, verbose=args.verbose,
                           steps_per_epoch=steps, seed=args.seed)
    wall = time.time() - t0
    img_s, step = _throughput(opt.last_run["step_times"], args.batch_size)
    comm = [c for c in opt.last_run.get("allreduce_seconds", []) if c]
    results["train"] = {
        "num_workers": n, "global_batch": args.batch_size, "img_per_sec": img_s, "step_time_s": step,
        "bar_img_per_sec": _bar_throughput(opt.last_run["step_times"], args.batch_size, steps),
        "wall_s": wall, "startup_s": opt.last_run.get("startup_s"), "steps": opt.global_step,
        "allreduce_share": (sum(comm) / sum(t for t in opt.last_run["step_times"] if t)) if comm else 0.0,
        "history": history, "step_times": opt.last_run["step_times"],
    }
    if args.scaling and n > 1:
        one_net, _ = build_net(args, classes)
        one = TFOptimizer(one_net, loss, _method(args, steps_hint))
        one.optimize(_train_input(src, per_rank, args.seed), epochs=1, num_workers=1, verbose=0,
                     steps_per_epoch=steps)
        img_1, _ = _throughput(one.last_run["step_times"], per_rank)
        results["train"]["img_per_sec_1_rank"] = img_1
        results["train"]["scaling_efficiency"] = img_s / (n * img_1)
    evaluate_net(args, opt.net, src, logits, results)
    if args.model_dir:
        opt.net.save(os.path.join(args.model_dir, "export"))


def evaluate_net(args, net, src, logits: bool, results: dict) -> None:
    from optim import metrics as M

    from .data import make_dataset

    if src.kind == "synthetic":
        ds = make_dataset(src, "validation", batch=32, training=False, seed=args.seed + 1)
    else:
        ds = make_dataset(src, "validation", batch=32, training=False)
    top1, top5 = M.Accuracy(), M.TopKAccuracy(5)
    t0, n = time.time(), 0
    for i, (x, y) in enumerate(ds):
        if args.eval_batches and i >= args.eval_batches:
            break
        out = net.forward(x)
        top1.update(y.numpy(), out)
        top5.update(y.numpy(), out)
        n += len(y)
    results["evaluate"] = {"top1": top1.result(), "top5": top5.result(), "images": n, "wall_s": time.time() - t0}


def evaluate_mode(args, spark, results: dict) -> None:
    src, classes = _source(args)
    net, logits = build_net(args, classes)
    evaluate_net(args, net, src, logits, results)


def inference_mode(args, spark, results: dict) -> None:
    import numpy as np

    _, classes = _source(args)
    net, _ = build_net(args, classes)
    x = np.random.default_rng(args.seed).uniform(-2, 2, (args.batch_size, args.image_size, args.image_size, 3)
                                                 ).astype("float32")
    net.forward(x)  # compile
    times = []
    for _ in range(5):
        t = time.perf_counter()
        net.forward(x)
        times.append(time.perf_counter() - t)
    results["inference"] = {"backend": "tensorflow", "batch": args.batch_size,
                            "img_per_sec": args.batch_size / statistics.median(times)}
    if args.backend == "openvino":
        from optim import TFPredictor

        predictor = TFPredictor(net, batch_per_thread=args.batch_size, backend="openvino")
        predictor.predict(x)
        ov_times = []
        for _ in range(5):
            t = time.perf_counter()
            predictor.predict(x)
            ov_times.append(time.perf_counter() - t)
        results["inference_openvino"] = {"batch": args.batch_size, "img_per_sec": args.batch_size / statistics.median(ov_times)}


def compare_mode(args, spark, results: dict) -> None:
    """The same model, data and optimiser through TFOptimizer and through Keras `fit`, on the same
    batches (the input pipeline's first pass is cached, so the random crops and flips are the same
    for both): the two losses per epoch, and how far apart they are (``loss_rel_diff``, the largest
    relative difference), beside the two throughputs."""
    import keras

    import optim
    from optim import TFOptimizer
    from tfnet import TFNet

    from .data import make_dataset

    src, classes = _source(args)
    keras.utils.set_random_seed(args.seed)
    model = keras.applications.ResNet50(weights=None, input_shape=(args.image_size, args.image_size, 3),
                                        classes=classes, classifier_activation=None)
    net = TFNet.from_keras(model)
    for layer in model.layers:  # like with like: frozen batch norm on both sides
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.trainable = False
    net.trainable = [v.path for v in model.trainable_variables]
    # cached: tfnet's first pass fills it, Keras (and every later epoch) reads the same batches back
    ds = make_dataset(src, "train", batch=args.batch_size, training=True, seed=args.seed).cache()
    opt = TFOptimizer(net, optim.losses.SparseCategoricalCrossentropy(from_logits=True),
                      optim.SGD(args.lr, momentum=args.momentum), metrics=["accuracy"])
    t = time.time()
    h1 = opt.optimize(ds, epochs=args.epochs, verbose=args.verbose)
    tfnet_wall = time.time() - t
    img_tfnet, step_tfnet = _throughput(opt.last_run["step_times"], args.batch_size)

    class Times(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.t = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter() - self.t)

    cb = Times()
    cb.times = []
    model.compile(optimizer=keras.optimizers.SGD(args.lr, momentum=args.momentum),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    t = time.time()
    h2 = model.fit(ds, epochs=args.epochs, verbose=0, callbacks=[cb], shuffle=False).history
    keras_wall = time.time() - t
    img_keras, step_keras = _throughput(cb.times, args.batch_size)
    diff = max(abs(a - b) / abs(b) for a, b in zip(h1["loss"], h2["loss"]))
    results["compare"] = {
        "tfnet": {"img_per_sec": img_tfnet, "step_time_s": step_tfnet, "wall_s": tfnet_wall, "loss": h1["loss"],
                  "steps": opt.global_step},
        "keras_fit": {"img_per_sec": img_keras, "step_time_s": step_keras, "wall_s": keras_wall, "loss": h2["loss"],
                      "steps": len(cb.times)},
        "loss_rel_diff": diff,
        "ratio": img_tfnet / img_keras, "batch": args.batch_size,
        "step_times": {"tfnet": opt.last_run["step_times"], "keras_fit": cb.times},
    }


def main(argv=None) -> dict:
    args = parse_args(argv)
    from .report import write_results

    spark = _spark(args.master) if args.mode == "train" else None
    results: dict = {"mode": args.mode, "data": args.data_format, "image_size": args.image_size,
                     "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                     "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS")}
    t0 = time.time()
    {"train": train_mode, "evaluate": evaluate_mode, "inference": inference_mode, "compare": compare_mode}[args.mode](
        args, spark, results)
    results["wall_s"] = time.time() - t0
    text = write_results(results, args.output)
    print(text)
    return results


def cli() -> None:
    """The console script: ``main`` without its return value (which would become the exit code)."""
    main()


if __name__ == "__main__":
    cli()
