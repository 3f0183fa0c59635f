"""Helpers shared by the benchmark scripts: environment set-up, timing, and reporting."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable


def setup_env(onednn: bool = True, threads: int | None = None) -> None:
    """Must run before TensorFlow is imported: oneDNN on/off and thread pools."""
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1" if onednn else "0"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if threads:
        from tfnet.config import set_num_threads

        set_num_threads(threads, threads)


def machine() -> dict:
    from tfnet.precision import cpu_flags, cpu_model

    # the SIMD and matrix extensions TensorFlow, oneDNN and OpenVINO choose kernels by
    flags = sorted(f for f in cpu_flags() if f.startswith(("avx2", "fma", "avx512", "avx_vnni", "amx")))
    return {"cpu": cpu_model(), "flags": flags, "cores": os.cpu_count(), "python": platform.python_version(),
            "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS"), "date": time.strftime("%Y-%m-%d")}


def banner() -> str:
    """One line naming the machine, for every benchmark's output."""
    m = machine()
    return (f"# {m['cpu']} ({m['cores']} cores; {' '.join(m['flags']) or 'no AVX2/AVX-512'}), Python {m['python']}, "
            f"oneDNN {m['onednn']}, {m['date']}")


def best_seconds(fn: Callable[[], object], rounds: int) -> float:
    """The shortest of ``rounds`` timed calls of ``fn``, after one untimed call (the warm-up)."""
    fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def matmul_ceilings(n: int = 2048, rounds: int = 5) -> dict:
    """TensorFlow's own matmul speed on this machine, the practical ceiling a model's step is measured
    against (issue 43): GFLOP/s of an ``n`` x ``n`` ``tf.linalg.matmul`` in float32 and in bfloat16 (the best of
    ``rounds``, after a warm-up), with oneDNN as the environment set it. bfloat16 is native only with
    ``avx512_bf16`` or ``amx_bf16``; elsewhere it is emulated and the figure says so."""
    import tensorflow as tf

    from tfnet.precision import bf16_missing, cpu_has_bf16

    out = {"n": n}
    for name, dtype in (("fp32", tf.float32), ("bf16", tf.bfloat16)):
        if name == "bf16" and _bf16_capped():  # TensorFlow sends it to oneDNN, which has no kernel under the cap
            out["bf16_not_measured"] = bf16_missing()
            continue
        a = tf.cast(tf.random.stateless_uniform((n, n), seed=(0, 1)), dtype)
        f = tf.function(lambda m: tf.linalg.matmul(m, m))
        out[f"{name}_gflops"] = 2 * n ** 3 / best_seconds(lambda f=f, a=a: f(a).numpy(), rounds) / 1e9
    flags = set(machine()["flags"])
    out["bf16_native"] = cpu_has_bf16()
    out["amx"] = "amx_bf16" in flags
    return out


def _bf16_capped() -> bool:
    """Whether oneDNN is capped below its bfloat16 kernels (as a Zen 3 is emulated): TensorFlow's bfloat16 matmul
    and OpenVINO's ``bf16`` hint find no kernel there on a CPU with bfloat16 (the process aborts, or the plugin
    refuses to compile), so that ceiling is not measured. (On a CPU without it, TensorFlow emulates bfloat16 and
    OpenVINO runs the hint in f32, whatever the cap.)"""
    from tfnet.precision import BF16_FLAGS, cpu_flags, onednn_capped_below_bf16

    return bool(cpu_flags() & BF16_FLAGS) and onednn_capped_below_bf16()


def openvino_matmul_ceilings(n: int = 2048, threads: int | None = None, rounds: int = 5) -> dict:
    """OpenVINO's own ``n`` x ``n`` matmul on the CPU, in fp32, bf16 and INT8 (both operands through a 256-level
    ``FakeQuantize``, which the CPU plugin runs as an int8 GEMM: VNNI or AMX), GOP/s (the best of ``rounds``).
    fp32 and INT8 run with ``INFERENCE_PRECISION_HINT`` ``f32``, as TFPredictor's fp32 and int8 do: left to its
    default, the plugin runs an fp32 model in bf16 on a CPU with bf16 (AMX, avx512_bf16), and "fp32" was bf16 there.
    bf16 is the hint ``bf16`` (on a CPU without bf16 the plugin runs it in f32: ``bf16_vs_fp32`` near 1).
    Their ratio is what INT8 gains on one large GEMM on this CPU, beside the figures a benchmark measures on a
    model (a network's convolutions run other kernels, and gained more than this ratio on an AMD EPYC). ``threads``:
    OpenVINO's threads (default: all cores)."""
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops

    def model(int8: bool):
        a = ops.parameter([n, n], np.float32, name="a")
        b = ops.constant(np.random.default_rng(0).uniform(-1, 1, (n, n)).astype(np.float32))
        x, w = a, b
        if int8:
            lo, hi = ops.constant(np.float32(-1.0)), ops.constant(np.float32(1.0))
            x = ops.fake_quantize(a, lo, hi, lo, hi, 256)
            w = ops.fake_quantize(b, lo, hi, lo, hi, 255)
        return ov.Model([ops.matmul(x, w, False, False)], [a])

    config = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}
    if threads:
        config["INFERENCE_NUM_THREADS"] = int(threads)
    data = np.random.default_rng(1).uniform(-1, 1, (n, n)).astype(np.float32)
    out = {"n": n, "threads": threads or "all", "precisions": {}}
    for name, int8, hint in (("fp32", False, "f32"), ("bf16", False, "bf16"), ("int8", True, "f32")):
        if name == "bf16" and _bf16_capped():
            continue
        compiled = ov.Core().compile_model(model(int8), "CPU", {**config, "INFERENCE_PRECISION_HINT": hint})
        out["precisions"][name] = compiled.get_property("INFERENCE_PRECISION_HINT").to_string()  # what the plugin runs
        request = compiled.create_infer_request()
        out[f"{name}_gops"] = 2 * n ** 3 / best_seconds(lambda r=request: r.infer({0: data}), rounds) / 1e9
    out["int8_vs_fp32"] = out["int8_gops"] / out["fp32_gops"]
    if "bf16_gops" in out:
        out["bf16_vs_fp32"] = out["bf16_gops"] / out["fp32_gops"]
    return out


def openvino_ceilings_line(c: dict) -> str:
    """One line of :func:`openvino_matmul_ceilings`' figures."""
    bf16 = (f"bf16 {c['bf16_gops']:.0f} GOP/s ({c['bf16_vs_fp32']:.2f}x fp32), " if "bf16_gops" in c else "")
    return (f"# ceilings: OpenVINO {c['n']}x{c['n']} matmul ({c['threads']} threads) fp32 {c['fp32_gops']:.0f} GOP/s, "
            f"{bf16}INT8 {c['int8_gops']:.0f} GOP/s ({c['int8_vs_fp32']:.2f}x fp32)")


def ceilings_line(c: dict) -> str:
    """One line of :func:`matmul_ceilings`' figures, printed beside a benchmark's own."""
    head = f"# ceilings: TF {c['n']}x{c['n']} matmul fp32 {c['fp32_gflops']:.0f} GFLOP/s, "
    if "bf16_gflops" not in c:
        return head + f"bf16 not measured ({c.get('bf16_not_measured')})"
    kind = "AMX" if c["amx"] else "avx512_bf16" if c["bf16_native"] else "emulated, no native bf16"
    return head + f"bf16 {c['bf16_gflops']:.0f} GFLOP/s ({kind}; {c['bf16_gflops'] / c['fp32_gflops']:.2f}x fp32)"


#: Keras's ResNet-50 at 224x224, GFLOP an image (two a multiply-add): its 53 convolutions 7.712 (TensorFlow's own
#: count, ``tf.compat.v1.profiler``'s ``float_operation``, says the same of each) and its dense layer 0.004. That is
#: 3.86 G multiply-adds, the paper's "3.8 x 10^9 FLOPs" (He et al. 2015, table 1): Keras's blocks stride their first
#: 1x1 convolution, as the paper's do; torchvision's 4.1 G strides the 3x3 one. Until 2026-12-07 the benchmarks said
#: 8.2 (4.1 G), and their shares of a matmul ceiling read 6% high for inference, 7% for a step.
RESNET50_GFLOP = 7.716
#: Of that, the first convolution's (7x7 from 3 channels), whose input gradient a training step never computes.
RESNET50_STEM_GFLOP = 0.236


def resnet50_gflop(size: int = 224, training: bool = False) -> float:
    """GFLOP an image of Keras's ResNet-50 at ``size`` x ``size`` (:data:`RESNET50_GFLOP` at 224, scaling with the
    pixels); a training step's: the forward pass, every weight's gradient, and every input gradient but the first
    convolution's (the image's: nothing reads it)."""
    scale = (size / 224) ** 2
    return (3 * RESNET50_GFLOP - RESNET50_STEM_GFLOP if training else RESNET50_GFLOP) * scale


def add_resnet50_args(p) -> None:
    """The arguments of the benchmarks that take ResNet-50 apart on one CPU (``profile_step.py``,
    ``bench_conv_kernels.py``): its size and batch, the precisions, TensorFlow's inter-op threads, the JSON."""
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--precision", default="fp32,bf16", help="comma-separated: fp32, bf16 (bf16 only where native)")
    p.add_argument("--inter-op", type=int, default=1, help="TensorFlow's inter-op threads (0: its default)")
    p.add_argument("--json", default=None)


def start_resnet50(args) -> dict:
    """Before TensorFlow is imported: oneDNN on and ``args.inter_op`` inter-op threads (one by default, so that kernels
    run one at a time and each one's seconds are its own); then the machine and its matmul ceilings, printed and
    returned."""
    setup_env(onednn=True)
    if args.inter_op:
        from tfnet.config import set_num_threads

        set_num_threads(None, args.inter_op)
    print(banner(), flush=True)
    ceilings = matmul_ceilings()
    print(ceilings_line(ceilings), flush=True)
    return ceilings


def resnet50_results(args, ceilings: dict, script: str, argv, **more) -> dict:
    """The head of such a benchmark's results: the machine, its arguments and ceilings, the command that ran it."""
    command = f"python benchmarks/{script} " + " ".join(sys.argv[1:] if argv is None else argv)
    return {"machine": machine(), "size": args.size, "batch": args.batch, **more, "ceilings": ceilings,
            "inter_op": args.inter_op, "command": command}


def native_precisions(args, results: dict, verb: str) -> list[str]:
    """``args.precision``'s precisions that run as asked here: bf16 only where the CPU has it natively; one left out is
    said, and recorded in ``results`` (``bf16_not_<verb>``)."""
    from tfnet.precision import bf16_missing

    out = []
    for precision in args.precision.split(","):
        if precision == "bf16" and bf16_missing():
            print(f"(bf16) not {verb}: {bf16_missing()}")
            results[f"bf16_not_{verb}"] = bf16_missing()
            continue
        out.append(precision)
    return out


def interleaved(fns: dict[str, Callable[[], None]], rounds: int, warmup: int = 1) -> dict[str, list[float]]:
    """Times each function ``rounds`` times, alternating between them so drift in machine speed
    hits every side alike. Returns seconds per call for each."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM). Unlike ``ru_maxrss``, which a child inherits
    from its parent across fork and exec, VmHWM starts afresh with each exec."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def write_json(path: str | None, obj: dict) -> None:
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(obj, f, indent=2)


def measure_ceilings() -> dict:
    """This CPU's matmul ceilings: TensorFlow's fp32 and bf16 (:func:`matmul_ceilings`) and OpenVINO's fp32 and INT8
    (:func:`openvino_matmul_ceilings`), measured in a fresh interpreter with this process's oneDNN setting, so that
    neither the benchmark's own threads, memory or start-up figures nor its TensorFlow settings change them (nor
    they the benchmark's). A part that cannot be measured here says why instead of a figure."""
    import subprocess

    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--ceilings"], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1][:200]}


def _has(c: object, key: str) -> dict | None:
    return c if isinstance(c, dict) and key in c else None


def ceilings_lines(tf_c: dict, ov_c: dict) -> list[str]:
    """The lines of the ceilings, TensorFlow's then OpenVINO's; a part not measured says why."""
    return [ceilings_line(tf_c) if _has(tf_c, "fp32_gflops") else f"# ceilings: TF not measured ({tf_c.get('error')})",
            openvino_ceilings_line(ov_c) if _has(ov_c, "int8_gops")
            else f"# ceilings: OpenVINO INT8 not measured ({ov_c.get('error')})"]


def finish(path: str | None, results: dict) -> dict:
    """The end of every benchmark: prints the machine and its matmul ceilings beside the benchmark's results (fp32,
    bf16 and INT8: the rates its figures are read against on this CPU kind), adds them to ``results`` (TensorFlow's
    under ``"ceilings"``, OpenVINO's under ``"openvino_ceilings"``; what the benchmark measured itself is kept), and
    writes ``results`` to ``path``."""
    tf_c, ov_c = _has(results.get("ceilings"), "fp32_gflops"), _has(results.get("openvino_ceilings"), "int8_gops")
    if not (tf_c and ov_c):
        measured = measure_ceilings()
        tf_c = tf_c or measured.get("tf") or measured
        ov_c = ov_c or measured.get("openvino") or measured
    results["ceilings"], results["openvino_ceilings"] = tf_c, ov_c
    print(banner(), flush=True)
    for line in ceilings_lines(tf_c, ov_c):
        print(line, flush=True)
    write_json(path, results)
    return results


if __name__ == "__main__":
    if sys.argv[1:] == ["--ceilings"]:
        out: dict = {"tf": matmul_ceilings()}
        try:
            out["openvino"] = openvino_matmul_ceilings()
        except Exception as e:  # noqa: BLE001 - reported as a line instead of a figure
            out["openvino"] = {"error": f"{type(e).__name__}: {e}"[:200]}
        print(json.dumps(out))
