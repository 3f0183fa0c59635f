"""The cost of the per-batch NaN/Inf check of ``tf.data`` input (issue 21) on ImageNet-sized
batches: ``optim.data.values.all_finite`` (one float32 sum; what every clean batch costs)
against the exact ``reduce_all(is_finite(x))`` it stands in for, timed in alternation in this
process, on a fresh batch each call (four batches in turn, 74 MB: more than the last-level cache,
as batches arriving from a pipeline are) and on one batch again and again (cache-warm); then
``finite_batch`` on a batch with one NaN row (the row search, then the row dropped), which only a
bad batch pays.

    python benchmarks/bench_input_checks.py [--batch 32] [--size 224] [--rounds 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import banner, finish, interleaved, machine, median, setup_env  # noqa: E402


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

    from optim.data.values import all_finite, finite_batch

    rng = np.random.default_rng(0)
    shape = (args.batch, args.size, args.size, 3)
    batches = [tf.constant(rng.standard_normal(shape, np.float32)) for _ in range(4)]
    fresh = itertools.cycle(batches)
    one = batches[0]
    exact = lambda x: bool(tf.reduce_all(tf.math.is_finite(x)))  # noqa: E731
    bad = one.numpy()
    bad[args.batch // 2, 0, 0, 0] = np.nan
    bad = tf.constant(bad)
    assert all_finite(one) and not all_finite(bad) and not exact(bad)
    cold = interleaved({"all_finite": lambda: all_finite(next(fresh)), "exact": lambda: exact(next(fresh))},
                       args.rounds, warmup=3)
    warm = interleaved({"all_finite": lambda: all_finite(one), "exact": lambda: exact(one)}, args.rounds, warmup=3)
    logging.getLogger("tfnet").setLevel(logging.ERROR)  # finite_batch's skip warning, once per call
    labels = tf.zeros([args.batch], tf.int64)
    skip = interleaved({"finite_batch": lambda: finite_batch([bad], labels, "skip", "bench")},
                       max(10, args.rounds // 10), warmup=2)
    us = lambda xs: median(xs) * 1e6  # noqa: E731
    out = {"machine": machine(), "batch": list(shape), "rounds": args.rounds,
           "us_fresh_batch": {k: us(v) for k, v in cold.items()},
           "us_same_batch": {k: us(v) for k, v in warm.items()},
           "us_finite_batch_one_nan_row_skip": us(skip["finite_batch"])}
    print(banner())
    print(f"batch {'x'.join(map(str, shape))} float32 ({one.numpy().nbytes / 2**20:.1f} MiB), median of "
          f"{args.rounds}, microseconds per check:")
    print(f"  {'':44s} {'fresh batch':>12s} {'same batch':>12s}")
    for key, name in (("all_finite", "all_finite (tfnet's check of a clean batch)"),
                      ("exact", "reduce_all(is_finite(x))")):
        print(f"  {name:44s} {out['us_fresh_batch'][key]:12.0f} {out['us_same_batch'][key]:12.0f}")
    print(f"  finite_batch, one NaN row, skip: {out['us_finite_batch_one_nan_row_skip']:.0f}")
    if args.json:
        finish(args.json, out)
    return out


if __name__ == "__main__":
    main()
