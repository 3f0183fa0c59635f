"""ONNX models exported by PyTorch: tfnet's forward against onnxruntime on the same threads, tfnet's
fine-tuning step, and for image models the layout choice (NHWC kept through element-wise ops,
against transposing back to NCHW after every convolution).

All sides run in this one process on the same model, batch and threads, timed in alternation.
Make the models with PyTorch first (PyTorch is not a tfnet dependency)::

    /tmp/torchenv/bin/python scripts/export_onnx_fixtures.py --full-resnet18 /tmp/resnet18.onnx
    python benchmarks/bench_onnx.py --model /tmp/resnet18.onnx [--batch 16] [--threads 2] [--json out.json]
    /tmp/torchenv/bin/python scripts/export_onnx_bench.py /tmp/onnx_bench       # issue 23's three
    python benchmarks/bench_onnx.py --model /tmp/onnx_bench/{mobilenet_v3,unet,gru_text}.onnx --batch 16

Without ``--model`` it runs the quarter-width 32x32 ResNet-18 test fixture. The fine-tuning step
trains every weight but the batch-norm statistics with SGD on the mean square of the first output
(a loss that fits any model); integer inputs (token ids) are drawn from 0 to 9.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import banner, finish, interleaved, machine, median, setup_env  # noqa: E402

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "onnx", "resnet18.onnx")


def _inputs(session, batch: int):
    import numpy as np

    rng = np.random.default_rng(0)
    feed = {}
    for i in session.get_inputs():
        shape = [d if isinstance(d, int) else batch for d in i.shape]
        shape[0] = batch
        feed[i.name] = (rng.integers(0, 10, shape).astype(np.int64) if "int" in i.type
                        else rng.standard_normal(shape).astype(np.float32))
    return feed


def bench_model(path: str, args) -> dict:
    import numpy as np
    import onnxruntime as ort
    import tensorflow as tf

    from tfnet import TFNet

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    feed = _inputs(session, args.batch)
    first = session.get_outputs()[0].name
    net = TFNet.from_onnx(path, outputs=first)
    xs = [tf.constant(v) for v in feed.values()]
    want = session.run([first], feed)[0]
    err = {"nhwc": float(np.abs(net.forward(xs) - want).max() / np.abs(want).max())}
    sides = {"onnxruntime": lambda: session.run([first], feed), "tfnet_nhwc": lambda: net.forward(xs, as_tensors=True)}
    image = len(xs) == 1 and xs[0].shape.rank == 4 and xs[0].dtype == tf.float32
    if image:
        nchw = TFNet.from_onnx(path, outputs=first, propagate_layout=False)
        err["nchw"] = float(np.abs(nchw.forward(xs) - want).max() / np.abs(want).max())
        sides["tfnet_nchw_transposes"] = lambda: nchw.forward(xs, as_tensors=True)
    fwd = {k: args.batch / median(v) for k, v in interleaved(sides, rounds=args.rounds).items()}
    cpu = {}  # CPU seconds per item: less sensitive than wall time to other processes on a shared machine
    for name in sides:  # (onnxruntime's threads spin while they wait, which counts here too)
        t0 = time.process_time()
        for _ in range(args.rounds):
            sides[name]()
        cpu[name] = (time.process_time() - t0) / (args.rounds * args.batch)

    def loss(t, o):
        return tf.reduce_mean(tf.square(o))

    step = net.train_step(loss, 1e-4)
    state = [step.init_state()]
    target = tf.zeros([args.batch])

    def train():
        result = step(xs if len(xs) > 1 else xs[0], target, state[0])
        state[0] = result.state
        result.loss.numpy()

    train_rate = args.batch / median(interleaved({"train": train}, rounds=args.rounds)["train"])
    result = {
        "model": os.path.basename(path), "input": {k: list(v.shape) for k, v in feed.items()},
        "forward_per_s": fwd, "forward_ratio_vs_onnxruntime": {k: v / fwd["onnxruntime"] for k, v in fwd.items()},
        "cpu_s_per_item": cpu, "max_rel_error_vs_onnxruntime": err,
        "train_step_per_s": train_rate, "train_over_forward": train_rate / fwd["tfnet_nhwc"],
        "train_over_onnxruntime_forward": train_rate / fwd["onnxruntime"],
    }
    if image:
        result["nhwc_over_nchw_transposes"] = fwd["tfnet_nhwc"] / fwd["tfnet_nchw_transposes"]
    return result


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", nargs="+", default=[FIXTURE], help="one or more .onnx files")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2, help="intra-op threads for both tfnet and onnxruntime")
    p.add_argument("--onednn", type=int, default=1)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    setup_env(bool(args.onednn))

    import tfnet

    tfnet.set_num_threads(args.threads, 1)
    print(f"{banner()}; threads={args.threads}, batch={args.batch}")
    results = {"machine": machine(), "threads": args.threads, "batch": args.batch, "models": []}
    for path in args.model:
        r = bench_model(path, args)
        results["models"].append(r)
        fwd = r["forward_per_s"]
        print(f"model {r['model']}, inputs {r['input']}")
        for k, v in fwd.items():
            print(f"  forward {k:24s} {v:9.1f} items/s  ({v / fwd['onnxruntime']:.2f}x onnxruntime)")
        if "nhwc_over_nchw_transposes" in r:
            print(f"  NHWC kept / NCHW transposes: {r['nhwc_over_nchw_transposes']:.2f}x wall")
        print("  CPU ms per item: " + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in r["cpu_s_per_item"].items()))
        print(f"  fine-tuning step {r['train_step_per_s']:.1f} items/s ({r['train_over_forward']:.2f}x of tfnet's "
              f"forward, {r['train_over_onnxruntime_forward']:.2f}x of onnxruntime's); max rel error vs onnxruntime "
              f"{r['max_rel_error_vs_onnxruntime']}")
    if len(results["models"]) == 1:  # the single-model layout of earlier runs
        results.update(results.pop("models")[0])
    finish(args.json, results)
    return results


if __name__ == "__main__":
    main()
