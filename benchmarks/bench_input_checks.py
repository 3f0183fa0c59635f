"""The cost of the per-batch NaN/Inf check of ``tf.data`` input (issue 21), on one ImageNet-sized
batch, against the step it guards: ``optim.training.checks.all_finite`` (one float32 sum, what
every clean batch costs), the exact ``reduce_all(is_finite(x))`` it stands in for, and
``finite_batch`` on a batch with one NaN row (the per-row search, then the rows dropped). Timed in
alternation in this process.

    python benchmarks/bench_input_checks.py [--batch 32] [--size 224] [--rounds 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import banner, interleaved, machine, median, setup_env, write_json  # noqa: E402


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    setup_env()
    import numpy as np
    import tensorflow as tf

    from optim.training.checks import all_finite, finite_batch

    x = tf.constant(np.random.default_rng(0).standard_normal((args.batch, args.size, args.size, 3), np.float32))
    y = tf.zeros([args.batch], tf.int64)
    bad_np = x.numpy()
    bad_np[args.batch // 2, 0, 0, 0] = np.nan
    bad = tf.constant(bad_np)
    assert all_finite(x) and not all_finite(bad)
    import logging

    logging.getLogger("tfnet").setLevel(logging.ERROR)  # finite_batch's skip warning, once per call
    times = interleaved({
        "all_finite (a clean batch, tfnet's check)": lambda: all_finite(x),
        "reduce_all(is_finite(x)) (exact, for comparison)": lambda: bool(tf.reduce_all(tf.math.is_finite(x))),
        "finite_batch, one NaN row, skip": lambda: finite_batch([bad], y, "skip", "bench"),
    }, args.rounds, warmup=3)
    out = {"machine": machine(), "batch": [args.batch, args.size, args.size, 3], "rounds": args.rounds,
           "us_per_check": {k: median(v) * 1e6 for k, v in times.items()}}
    print(banner())
    print(f"batch {args.batch}x{args.size}x{args.size}x3 float32 ({x.numpy().nbytes / 2**20:.1f} MiB), "
          f"median of {args.rounds}:")
    for k, v in out["us_per_check"].items():
        print(f"  {k:52s} {v:9.0f} us")
    if args.json:
        write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
