"""ResNet-50's convolution kernels against matmuls of the same shape: which of a training step's three kinds of
convolution (forward, input gradient, filter gradient) falls short of what this CPU's matmul reaches, and by how much.

``profile_step.py`` says how much of a step its contraction kernels take and the rate they reach together; this says
which kernels hold that rate down. For every convolution of Keras's ResNet-50 (53 at 224x224: the distinct shapes
once, weighted by how many the model has; the first one's input gradient left out, as a step leaves it) it times
each of the three kernels as one TensorFlow op (oneDNN's where it is on: ``_MklNativeConv2D``, ``..BackpropInput``,
``..BackpropFilter``) in alternation with a matmul of the same FLOP in the GEMM shape that convolution is (im2col's):

* forward: ``[N*Ho*Wo, kh*kw*Cin] x [kh*kw*Cin, Cout]``;
* input gradient: ``[N*Ho*Wo, Cout] x [Cout, kh*kw*Cin]``;
* filter gradient: ``[kh*kw*Cin, N*Ho*Wo] x [N*Ho*Wo, Cout]``.

The matmul is the rate the same GEMM reaches on this CPU, a ceiling for that shape (a 1x1 convolution at stride 1
*is* its matmul; run as one inside the step, it gained nothing on Zen 5: docs/benchmarks.md, session 104). Each
kind's sum over the model is printed beside the 2048x2048 matmul ceiling. Where tfnet runs a strided 1x1 convolution
over a strided view (tfnet.kernels.strided_1x1_routed: oneDNN's AVX2 kernels), its shape is the view's at stride 1,
as the step runs it; TensorFlow's own kernel for it is never run there (it writes outside its buffers). bf16 only
where the CPU has it natively, as ``profile_step.py``. Issue 57's question on AMX (the bf16 step at 38% of the bf16
matmul rate, 2026-11-28): whether the gap is in oneDNN's convolution kernels, and in which.

    python benchmarks/bench_conv_kernels.py [--size 224] [--batch 16] [--rounds 5] [--precision fp32,bf16]
                                            [--shapes] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import add_resnet50_args, finish, interleaved, median, native_precisions, resnet50_results, start_resnet50  # noqa: E402

KINDS = ("forward", "input_gradient", "filter_gradient")
SHORT = {"forward": "fwd", "input_gradient": "dx", "filter_gradient": "dw"}
#: A convolution as the step runs it; ``reads_image``: the first, whose input gradient no step computes
Conv = collections.namedtuple("Conv", "batch height width cin kh kw cout stride padding reads_image",
                              defaults=(False,))


def resnet50_convolutions(size: int, batch: int) -> collections.Counter:
    """Keras's ResNet-50's convolutions at ``size`` x ``size`` and ``batch``, as the step runs them: ``{Conv: how
    many}``. A strided 1x1 convolution tfnet runs over a strided view (tfnet.kernels) is the view's at stride 1."""
    import keras

    from tfnet.kernels import strided_1x1_routed

    model = keras.applications.ResNet50(weights=None, input_shape=(size, size, 3))
    found: collections.Counter = collections.Counter()
    first = True
    for layer in model.layers:
        if not isinstance(layer, keras.layers.Conv2D):
            continue
        _, h, w, cin = layer.input.shape
        (kh, kw), (sh, sw) = layer.kernel_size, layer.strides
        stride, padding = sh, layer.padding.upper()
        if sh != sw:
            raise ValueError(f"{layer.name}: strides {layer.strides}")
        if (kh, kw) == (1, 1) and stride > 1 and strided_1x1_routed():
            h, w, stride, padding = -(-h // stride), -(-w // stride), 1, "VALID"
        found[Conv(batch, h, w, cin, kh, kw, layer.filters, stride, padding, first)] += 1
        first = False
    return found


def output_size(c: Conv) -> tuple[int, int]:
    if c.padding == "SAME":
        return -(-c.height // c.stride), -(-c.width // c.stride)
    return (c.height - c.kh) // c.stride + 1, (c.width - c.kw) // c.stride + 1


def gflop(c: Conv) -> float:
    """One kernel's GFLOP: each of the three kinds is the same number of multiply-adds."""
    ho, wo = output_size(c)
    return 2 * c.batch * ho * wo * c.kh * c.kw * c.cin * c.cout / 1e9


def gemm_shapes(c: Conv) -> dict[str, tuple[int, int, int]]:
    """Each kind's GEMM ``(m, k, n)``: ``[m, k] x [k, n]``, as im2col writes it."""
    ho, wo = output_size(c)
    pixels, window = c.batch * ho * wo, c.kh * c.kw * c.cin
    return {"forward": (pixels, window, c.cout), "input_gradient": (pixels, c.cout, window),
            "filter_gradient": (window, pixels, c.cout)}


def kinds(c: Conv) -> tuple[str, ...]:
    """The kernels a step runs of ``c``: all three, but for the first convolution no input gradient."""
    return tuple(k for k in KINDS if not (k == "input_gradient" and c.reads_image))


def uniform(shape, dtype, seed: int, k: int):
    """A tensor of ``shape``, uniform in [-1, 1]: drawn in float32 (stateless, from ``(seed, k)``), cast to ``dtype``."""
    import tensorflow as tf

    return tf.cast(tf.random.stateless_uniform(shape, (seed, k), -1, 1), dtype)


def operands(c: Conv, dtype, seed: int = 0) -> tuple:
    """``(x, w, dy)`` of ``c``'s shapes: the input, the filter and the output's gradient (:func:`uniform`)."""
    ho, wo = output_size(c)
    shapes = ([c.batch, c.height, c.width, c.cin], [c.kh, c.kw, c.cin, c.cout], [c.batch, ho, wo, c.cout])
    return tuple(uniform(s, dtype, seed, k) for k, s in enumerate(shapes))


def kernels(c: Conv, dtype, seed: int = 0) -> dict[str, tuple]:
    """``{kind: (the convolution kernel, the matmul)}`` for each of :func:`kinds`, each a call of one TensorFlow op on
    :func:`operands` (the matmul's on its own operands of :func:`gemm_shapes`) that returns its result."""
    import tensorflow as tf

    x, w, dy = operands(c, dtype, seed)
    strides = [1, c.stride, c.stride, 1]
    x_size, w_size = tf.constant(x.shape.as_list()), tf.constant(w.shape.as_list())
    convs = {
        "forward": lambda: tf.raw_ops.Conv2D(input=x, filter=w, strides=strides, padding=c.padding),
        "input_gradient": lambda: tf.raw_ops.Conv2DBackpropInput(
            input_sizes=x_size, filter=w, out_backprop=dy, strides=strides, padding=c.padding),
        "filter_gradient": lambda: tf.raw_ops.Conv2DBackpropFilter(
            input=x, filter_sizes=w_size, out_backprop=dy, strides=strides, padding=c.padding),
    }
    out = {}
    for kind in kinds(c):
        m, k, n = gemm_shapes(c)[kind]
        i = KINDS.index(kind)
        a, b = uniform([m, k], dtype, seed, 10 + 2 * i), uniform([k, n], dtype, seed, 11 + 2 * i)
        out[kind] = (tf.function(convs[kind]), tf.function(lambda a=a, b=b: tf.linalg.matmul(a, b)))
    return out


def measure(convs: collections.Counter, dtype, rounds: int) -> dict:
    """Each shape's and each kind's seconds, the convolution against its matmul (medians of ``rounds`` calls in
    alternation after a warm-up), and each kind's sums over the model (a shape counted as often as it occurs)."""
    shapes, totals = [], {kind: {"conv_s": 0.0, "matmul_s": 0.0, "gflop": 0.0} for kind in KINDS}
    for c, count in sorted(convs.items(), key=lambda kv: -gflop(kv[0]) * kv[1]):
        row = {"shape": c._asdict(), "count": count, "gflop": gflop(c)}
        for kind, (conv, mm) in kernels(c, dtype).items():
            times = interleaved({"conv": conv, "matmul": mm}, rounds)
            conv_s, mm_s = median(times["conv"]), median(times["matmul"])
            row[kind] = {"conv_s": conv_s, "matmul_s": mm_s, "conv_gflops": gflop(c) / conv_s,
                         "matmul_gflops": gflop(c) / mm_s}
            totals[kind]["conv_s"] += count * conv_s
            totals[kind]["matmul_s"] += count * mm_s
            totals[kind]["gflop"] += count * gflop(c)
        shapes.append(row)
    for t in totals.values():
        t["conv_gflops"], t["matmul_gflops"] = t["gflop"] / t["conv_s"], t["gflop"] / t["matmul_s"]
        t["conv_vs_matmul"] = t["matmul_s"] / t["conv_s"]
    conv_s = sum(t["conv_s"] for t in totals.values())
    return {"kinds": totals, "shapes": shapes, "conv_s": conv_s,
            "matmul_s": sum(t["matmul_s"] for t in totals.values()),
            "gflop": sum(t["gflop"] for t in totals.values()), "convolutions": sum(convs.values())}


def report(name: str, r: dict, ceiling: float | None, show_shapes: bool) -> None:
    pct = (lambda g: f", {100 * g / ceiling:.0f}% of the ceiling") if ceiling else (lambda g: "")
    print(f"({name}) {r['convolutions']} convolutions, {r['gflop']:.1f} GFLOP a step: the convolution kernels "
          f"{r['conv_s']:.3f} s ({r['gflop'] / r['conv_s']:.0f} GFLOP/s{pct(r['gflop'] / r['conv_s'])}), the "
          f"same-shape matmuls {r['matmul_s']:.3f} s ({r['gflop'] / r['matmul_s']:.0f} GFLOP/s)")
    for kind, t in r["kinds"].items():
        print(f"    {kind:16s} conv {t['conv_s']:.3f} s, {t['conv_gflops']:5.0f} GFLOP/s{pct(t['conv_gflops'])}; "
              f"matmul {t['matmul_s']:.3f} s, {t['matmul_gflops']:5.0f} GFLOP/s; conv at {t['conv_vs_matmul']:.2f}x "
              "the matmul's rate")
    if show_shapes:
        for row in r["shapes"]:
            c = Conv(**row["shape"])
            rates = "  ".join(f"{SHORT[kind]} {row[kind]['conv_gflops']:4.0f}/{row[kind]['matmul_gflops']:4.0f}"
                              for kind in kinds(c))
            print(f"    {row['count']:2d}x {c.height}x{c.width}x{c.cin} {c.kh}x{c.kw}/{c.stride} -> {c.cout}: "
                  f"{rates} GFLOP/s (conv/matmul)")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_resnet50_args(p)
    p.add_argument("--rounds", type=int, default=5, help="timed calls of each kernel, in alternation")
    p.add_argument("--shapes", action="store_true", help="print every shape's rates")
    args = p.parse_args(argv)
    ceilings = start_resnet50(args)
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")  # a function for each kernel of each shape, each traced once: no "retracing"
    convs = resnet50_convolutions(args.size, args.batch)
    results = resnet50_results(args, ceilings, "bench_conv_kernels.py", argv, rounds=args.rounds)
    for precision in native_precisions(args, results, "measured"):
        dtype = {"fp32": tf.float32, "bf16": tf.bfloat16}[precision]
        results[precision] = measure(convs, dtype, args.rounds)
        report(precision, results[precision], ceilings.get(f"{precision}_gflops"), args.shapes)
    finish(args.json, results)
    return results


if __name__ == "__main__":
    main()
