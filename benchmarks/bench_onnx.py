"""ONNX ResNet-18 exported by PyTorch: tfnet's forward against onnxruntime on the same threads, the
layout choice (NHWC kept through element-wise ops, against transposing back to NCHW after every
convolution), and tfnet's fine-tuning step rate.

All sides run in this one process on the same model, batch and threads, timed in alternation.
Make the full-width model with PyTorch first (PyTorch is not a tfnet dependency)::

    /tmp/torchenv/bin/python scripts/export_onnx_fixtures.py --full-resnet18 /tmp/resnet18.onnx
    python benchmarks/bench_onnx.py --model /tmp/resnet18.onnx [--batch 16] [--threads 2] [--json out.json]

Without ``--model`` it runs the quarter-width 32x32 test fixture.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import banner, interleaved, machine, median, setup_env, write_json  # noqa: E402

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "onnx", "resnet18.onnx")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=FIXTURE)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2, help="intra-op threads for both tfnet and onnxruntime")
    p.add_argument("--onednn", type=int, default=1)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    setup_env(bool(args.onednn))

    import numpy as np
    import onnxruntime as ort
    import tensorflow as tf

    import tfnet
    from tfnet import TFNet

    tfnet.set_num_threads(args.threads, 1)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(args.model, opts, providers=["CPUExecutionProvider"])
    shape = [d if isinstance(d, int) else args.batch for d in session.get_inputs()[0].shape]
    shape[0] = args.batch
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    feed = {session.get_inputs()[0].name: x}

    nhwc = TFNet.from_onnx(args.model)
    nchw = TFNet.from_onnx(args.model, propagate_layout=False)
    want = session.run(None, feed)[0]
    err = {k: float(np.abs(n.forward(x) - want).max() / np.abs(want).max()) for k, n in (("nhwc", nhwc), ("nchw", nchw))}
    xt = tf.constant(x)
    times = interleaved({
        "onnxruntime": lambda: session.run(None, feed),
        "tfnet_nhwc": lambda: nhwc.forward(xt, as_tensors=True),
        "tfnet_nchw_transposes": lambda: nchw.forward(xt, as_tensors=True),
    }, rounds=args.rounds)
    fwd = {k: args.batch / median(v) for k, v in times.items()}
    # CPU seconds per image: less sensitive than wall time to other processes on a shared machine
    cpu = {}
    for name, fn in (("tfnet_nhwc", lambda: nhwc.forward(xt, as_tensors=True)),
                     ("tfnet_nchw_transposes", lambda: nchw.forward(xt, as_tensors=True))):
        t0 = time.process_time()
        for _ in range(args.rounds):
            fn()
        cpu[name] = (time.process_time() - t0) / (args.rounds * args.batch)

    # fine-tuning: every weight but the batch-norm statistics, SGD, one fused step
    classes = want.shape[-1]
    y = tf.constant(np.random.default_rng(1).integers(0, classes, args.batch).astype(np.int64))

    def loss(t, o):
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(t, o))

    step = nhwc.train_step(loss, 1e-3)
    state = [step.init_state()]

    def train():
        result = step(xt, y, state[0])
        state[0] = result.state
        result.loss.numpy()

    train_times = interleaved({"train": train}, rounds=args.rounds)["train"]
    results = {
        "machine": machine(),
        "model": os.path.basename(args.model), "input": shape, "threads": args.threads,
        "forward_img_per_s": fwd,
        "forward_ratio_vs_onnxruntime": {k: v / fwd["onnxruntime"] for k, v in fwd.items()},
        "nhwc_over_nchw_transposes": fwd["tfnet_nhwc"] / fwd["tfnet_nchw_transposes"],
        "cpu_s_per_img": cpu,
        "nchw_cpu_over_nhwc_cpu": cpu["tfnet_nchw_transposes"] / cpu["tfnet_nhwc"],
        "max_rel_error_vs_onnxruntime": err,
        "train_step_img_per_s": args.batch / median(train_times),
        "train_over_forward": (args.batch / median(train_times)) / fwd["tfnet_nhwc"],
    }
    print(f"{banner()}; threads={args.threads}")
    print(f"model {results['model']}, input {shape}")
    for k, v in fwd.items():
        print(f"  forward {k:24s} {v:8.1f} img/s  ({v / fwd['onnxruntime']:.2f}x onnxruntime)")
    print(f"  NHWC kept / NCHW transposes: {results['nhwc_over_nchw_transposes']:.2f}x wall, "
          f"{results['nchw_cpu_over_nhwc_cpu']:.2f}x in CPU time ({cpu['tfnet_nhwc'] * 1e3:.1f} vs "
          f"{cpu['tfnet_nchw_transposes'] * 1e3:.1f} CPU ms/img); max rel error vs onnxruntime {err}")
    print(f"  fine-tuning step {results['train_step_img_per_s']:.1f} img/s ({results['train_over_forward']:.2f}x of forward)")
    write_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
