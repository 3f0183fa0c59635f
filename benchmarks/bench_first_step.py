"""Time to the first training step: tfnet's fused step (``TFNet.train_step(...).run``) against Keras's own step
(``model.train_on_batch``, what ``fit`` compiles) on the same Keras model, batch, loss and optimiser (SGD with
momentum 0.9; batch norm trained on the batch's statistics on both sides: ``from_keras(train_batch_norm=True)``).

Each case runs in a fresh process (nothing traced or optimised before it), the two interleaved over ``--rounds``
rounds (medians). Per case: the first step's seconds and CPU-seconds (tracing the step, TensorFlow's graph
optimiser, the kernels' set-up, the step itself), the median of the next ``--steps`` steps, and for tfnet
``from_keras``'s freeze beside it (Keras has nothing to freeze). Every Spark rank pays a first step once per run
(once per attempt), so this is the start-up a run's ranks pay after TensorFlow's import.

    python benchmarks/bench_first_step.py [--model resnet50|nasnet|small] [--size 32] [--batch 8] [--rounds 3]
                                          [--steps 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import banner, finish, machine, median, setup_env  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = ("keras", "tfnet")
MODELS = ("resnet50", "nasnet", "small")


def build(model: str, size: int, classes: int = 10, seed: int = 0):
    """The Keras model (random weights, no download)."""
    import keras

    keras.utils.set_random_seed(seed)
    if model == "resnet50":
        return keras.applications.ResNet50(weights=None, input_shape=(size, size, 3), classes=classes,
                                           classifier_activation=None)
    if model == "nasnet":
        return keras.applications.NASNetMobile(weights=None, input_shape=(size, size, 3), classes=classes,
                                               classifier_activation=None)
    if model == "small":
        return keras.Sequential([keras.Input((size, size, 3)), keras.layers.Conv2D(8, 3, activation="relu"),
                                 keras.layers.BatchNormalization(), keras.layers.GlobalAveragePooling2D(),
                                 keras.layers.Dense(classes)])
    raise SystemExit(f"--model must be one of {', '.join(MODELS)}, not {model!r}")


def run_case(case: str, model: str, size: int, batch: int, steps: int) -> dict:
    """One case in this process: ``{"first_s", "first_cpu_s", "later_s", ...}``."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, size, size, 3)).astype(np.float32)
    y = (np.arange(batch) % 10).astype(np.int64)
    keras_model = build(model, size)
    out: dict = {"case": case}
    if case == "keras":
        import keras

        keras_model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=False)

        def step():
            return float(keras_model.train_on_batch(x, y))
    elif case == "tfnet":
        import optim
        from tfnet import TFNet

        t0 = time.perf_counter()
        net = TFNet.from_keras(keras_model, train_batch_norm=True)
        out["from_keras_s"] = time.perf_counter() - t0
        train = net.train_step(optim.losses.SparseCategoricalCrossentropy(from_logits=True),
                               optim.SGD(0.01, momentum=0.9))

        def step():
            return float(train.run(x, y).loss)
    else:
        raise SystemExit(f"--case must be one of {', '.join(CASES)}, not {case!r}")
    t0, c0 = time.perf_counter(), time.process_time()
    out["first_loss"] = step()
    out["first_s"], out["first_cpu_s"] = time.perf_counter() - t0, time.process_time() - c0
    later = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        later.append(time.perf_counter() - t0)
    out["later_s"] = median(later) if later else None  # None: no later step asked for
    return out


def in_fresh_process(case: str, args) -> dict:
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--case", case, "--model", args.model,
                           "--size", str(args.size), "--batch", str(args.batch), "--steps", str(args.steps)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("CASE ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"the {case} case failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("CASE "):])


def main(argv: list[str] | None = None) -> dict | None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50", choices=MODELS)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=10, help="later steps timed after the first")
    p.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # one case in this process (the runs' own)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.steps < 1 or args.rounds < 1:
        p.error("--steps and --rounds take 1 or more")
    setup_env()
    if args.case:
        print("CASE " + json.dumps(run_case(args.case, args.model, args.size, args.batch, args.steps)), flush=True)
        return None
    print(banner(), flush=True)
    runs: dict[str, list[dict]] = {c: [] for c in CASES}
    for r in range(args.rounds):
        for case in (CASES if r % 2 == 0 else CASES[::-1]):  # interleaved, the order alternating
            runs[case].append(in_fresh_process(case, args))
            found = runs[case][-1]
            print(f"round {r + 1} {case}: first step {found['first_s']:.2f} s ({found['first_cpu_s']:.2f} CPU-s), "
                  f"later {found['later_s'] * 1000:.0f} ms", flush=True)
    summary = {}
    for case, found in runs.items():
        summary[case] = {key: median([f[key] for f in found]) for key in ("first_s", "first_cpu_s", "later_s")}
        if case == "tfnet":
            summary[case]["from_keras_s"] = median([f["from_keras_s"] for f in found])
    k, t = summary["keras"], summary["tfnet"]
    ratios = {"first_step_tfnet_over_keras": t["first_s"] / k["first_s"],
              "first_step_cpu_tfnet_over_keras": t["first_cpu_s"] / k["first_cpu_s"],
              "later_step_tfnet_over_keras": t["later_s"] / k["later_s"]}
    print(f"{args.model} {args.size}x{args.size}, batch {args.batch}, {args.rounds} rounds (medians):")
    print(f"  Keras train_on_batch: first step {k['first_s']:.2f} s ({k['first_cpu_s']:.2f} CPU-s), "
          f"later {k['later_s'] * 1000:.0f} ms")
    print(f"  tfnet train_step.run: first step {t['first_s']:.2f} s ({t['first_cpu_s']:.2f} CPU-s), "
          f"later {t['later_s'] * 1000:.0f} ms; from_keras {t['from_keras_s']:.2f} s before it")
    print("  tfnet / Keras: first step {first_step_tfnet_over_keras:.2f}x, its CPU {first_step_cpu_tfnet_over_keras:.2f}x,"
          " later steps {later_step_tfnet_over_keras:.2f}x".format(**ratios))
    results = {"machine": machine(), "command": "python benchmarks/bench_first_step.py " + " ".join(argv or sys.argv[1:]),
               "model": args.model, "size": args.size, "batch": args.batch, "rounds": args.rounds,
               "summary": summary, "ratios": ratios, "runs": runs}
    return finish(args.json, results)


if __name__ == "__main__":
    main()
