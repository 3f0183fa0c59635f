"""Where a fine-tuning step's time goes: tfnet's fused step on ResNet-50 (224x224, batch 16, batch norm frozen, SGD,
as ``bench_precision.py``'s (a)) under TensorFlow's profiler, its kernels' time summed by kind of op.

For each precision (fp32; bf16 where the CPU has it natively): the step's wall time unprofiled and profiled (the
profiler's own cost), the kernels' seconds by kind of op (each kernel's wall time, its intra-op threads together),
the executor's own seconds around them and the gaps between, and the convolutions' and matmuls' share and the rate
they reach by themselves (the model's FLOP over their seconds) beside TensorFlow's own matmul ceiling. The inter-op
pool is one thread (``--inter-op``), so that kernels run one at a time and their seconds add up to the step's: with
two, a backward convolution's two gradients run side by side, each at half the machine, and no kernel's time is its
own. It tells apart a step held back by its contraction kernels (their rate far from the ceiling) from one held back
by what runs around them (casts, elementwise ops, the executor): issue 57's question for the bf16 step on AMX (38% of
the bf16 matmul rate, 2026-11-28).

    python benchmarks/profile_step.py [--size 224] [--batch 16] [--steps 3] [--precision fp32,bf16] [--top 12]
                                      [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import add_resnet50_args, finish, median, native_precisions, resnet50_gflop, resnet50_results, start_resnet50  # noqa: E402

#: Op types that are convolutions or matrix products (TensorFlow's and oneDNN's names, fused or not)
CONTRACTION_WORDS = ("Conv", "MatMul", "Einsum")
#: The executor's event around each kernel it runs (its own time is its duration less the kernel's)
EXECUTOR_EVENT = "ExecutorState::Process"


def is_contraction(op_type: str) -> bool:
    return any(word in op_type for word in CONTRACTION_WORDS)


def profile(fn, steps: int) -> tuple[object, list[float]]:
    """Runs ``fn`` ``steps`` times under TensorFlow's profiler: (the trace's ``XSpace``, each call's seconds)."""
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    logdir = tempfile.mkdtemp(prefix="tfnet-profile-")
    seconds = []
    tf.profiler.experimental.start(logdir)
    try:
        for _ in range(steps):
            t0 = time.perf_counter()
            fn()
            seconds.append(time.perf_counter() - t0)
    finally:
        tf.profiler.experimental.stop()
    paths = glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb"))
    if len(paths) != 1:
        raise RuntimeError(f"expected one profile under {logdir}, found {paths}")
    space = xplane_pb2.XSpace()
    with open(paths[0], "rb") as f:
        space.ParseFromString(f.read())
    return space, seconds


def kernel_seconds(space) -> tuple[dict[str, float], dict[str, int], float]:
    """From a profile of the host CPU: ``({op type: seconds}, {op type: kernels run}, the executor's own seconds)``.

    TensorFlow names a kernel's event ``"<node name>:<op type>"`` on the line of the thread that ran it, inside the
    executor's :data:`EXECUTOR_EVENT`; the executor's own time is its events' time less the kernels' inside them.
    Its other events are C++ scopes (``"ThreadpoolListener::Record"``, ``"EagerCopyToDevice"``), left out."""
    seconds: dict[str, float] = collections.defaultdict(float)
    counts: dict[str, int] = collections.Counter()
    executor = kernels = 0.0
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            if not line.name.startswith("tf_"):  # TensorFlow's threads ("tf_Compute/...", "tf_numa_...")
                continue
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if name == EXECUTOR_EVENT:
                    executor += event.duration_ps / 1e12
                elif ":" in name and "::" not in name:
                    op_type = name.rsplit(":", 1)[1]
                    seconds[op_type] += event.duration_ps / 1e12
                    counts[op_type] += 1
                    kernels += event.duration_ps / 1e12
    return dict(seconds), dict(counts), max(executor - kernels, 0.0)


def breakdown(space, step_seconds: list[float], gflop_a_step: float, steps: int) -> dict:
    """A step's seconds, per step: the profiled wall (median), the kernels' (contractions and the rest, each kernel
    once), the executor's own; the contractions' own GFLOP/s; every op type's seconds and kernels a step."""
    seconds, counts, executor = kernel_seconds(space)
    per_step = {k: v / steps for k, v in seconds.items()}
    contractions = sum(v for k, v in per_step.items() if is_contraction(k))
    others = sum(v for k, v in per_step.items() if not is_contraction(k))
    wall = median(step_seconds)
    return {
        "wall_s": wall, "kernels_s": contractions + others, "contractions_s": contractions,
        "other_kernels_s": others, "executor_s": executor / steps,
        "gaps_s": max(wall - contractions - others - executor / steps, 0.0),
        "contraction_gflops": gflop_a_step / contractions if contractions else None,
        "op_seconds": dict(sorted(per_step.items(), key=lambda kv: -kv[1])),
        "op_counts": {k: counts[k] / steps for k in sorted(counts, key=lambda k: -per_step[k])},
    }


def report(name: str, b: dict, ceiling_gflops: float | None, top: int) -> None:
    kernels = b["kernels_s"]
    print(f"({name}) a step: {b['unprofiled_s']:.3f} s, {b['wall_s']:.3f} s profiled; kernels {kernels:.3f} s: "
          f"contractions {b['contractions_s']:.3f} ({100 * b['contractions_s'] / kernels:.0f}%), the rest "
          f"{b['other_kernels_s']:.3f} ({100 * b['other_kernels_s'] / kernels:.0f}%); the executor's own "
          f"{b['executor_s']:.3f} s; gaps {b['gaps_s']:.3f} s")
    if b["contraction_gflops"] and ceiling_gflops:
        print(f"    the contractions by themselves: {b['contraction_gflops']:.0f} GFLOP/s, "
              f"{100 * b['contraction_gflops'] / ceiling_gflops:.0f}% of the {name} matmul ceiling ({ceiling_gflops:.0f}); "
              f"the step: {100 * b['step_gflops'] / ceiling_gflops:.0f}%")
    for op_type, s in list(b["op_seconds"].items())[:top]:
        print(f"    {s:8.4f} s {100 * s / kernels:5.1f}%  {b['op_counts'][op_type]:6.1f} a step  {op_type}")


def step_for(size: int, batch: int, precision: str):
    """ResNet-50's step as bench_precision.py's (a) builds it: every weight trains, batch norm frozen, SGD 1e-3."""
    import keras
    import numpy as np
    import tensorflow as tf

    from tfnet import TFNet

    keras.utils.set_random_seed(0)
    model = keras.applications.ResNet50(weights=None, input_shape=(size, size, 3))
    net = TFNet.from_keras(model)
    net.trainable = [v.path for v in model.trainable_variables]
    sce = keras.losses.SparseCategoricalCrossentropy()
    step = net.train_step(lambda t, o: sce(t, o), 1e-3, precision=precision)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.uniform(-1, 1, (batch, size, size, 3)).astype("float32"))
    y = tf.constant(rng.integers(0, 1000, batch).astype("int64"))
    state = step.init_state()
    return step, lambda: step(x, y, state).loss.numpy()


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_resnet50_args(p)
    p.add_argument("--steps", type=int, default=3, help="profiled steps, after two that are not")
    p.add_argument("--top", type=int, default=12, help="op types listed")
    args = p.parse_args(argv)
    ceilings = start_resnet50(args)
    gflop = resnet50_gflop(args.size, training=True) * args.batch
    results = resnet50_results(args, ceilings, "profile_step.py", argv, steps=args.steps)
    for precision in native_precisions(args, results, "profiled"):
        _, call = step_for(args.size, args.batch, precision)
        for _ in range(2):
            call()
        unprofiled = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            call()
            unprofiled.append(time.perf_counter() - t0)
        space, seconds = profile(call, args.steps)
        results[precision] = b = breakdown(space, seconds, gflop, args.steps)
        b["unprofiled_s"] = median(unprofiled)
        b["step_gflops"] = gflop / b["unprofiled_s"]
        report(precision, results[precision], ceilings.get(f"{precision}_gflops"), args.top)
    finish(args.json, results)
    return results


if __name__ == "__main__":
    main()
