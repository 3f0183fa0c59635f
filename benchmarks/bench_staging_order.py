"""What an elastic run pays for staging its DataFrame in an order of the rows' values
(``optim.launch.backends.base.in_canonical_order``: a sort within each partition by ``xxhash64`` of the row), which
lets an epoch resumed on fewer ranks take each row once (``optim.data.virtual_shards``).

The DataFrame (built in code) ends in a shuffle, as a user's often does (``repartition(2)``), and is read to the end by
one Arrow task per partition (``mapInArrow``, as the training stage reads it), as it is and in canonical order, in
alternation after a warm-up, on ``local[2]``. Two kinds of rows: encoded images (``--image-bytes`` of bytes each) and
float arrays (``--floats`` per row). The ratio is the canonical staging's seconds over the plain one's.

    python benchmarks/bench_staging_order.py [--rows 4000] [--image-bytes 100000] [--floats 784] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import banner, finish, interleaved, machine, median  # noqa: E402


def read_all(frame) -> int:
    """Every row of every partition through one Arrow task each; the rows read."""
    def count(batches):
        import pyarrow as pa

        n = sum(b.num_rows for b in batches)
        yield pa.RecordBatch.from_pydict({"n": [n]})

    return sum(r.n for r in frame.mapInArrow(count, "n long").collect())


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4000)
    ap.add_argument("--image-bytes", type=int, default=100_000)
    ap.add_argument("--floats", type=int, default=784)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from optim.launch.backends.base import in_canonical_order

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.driver.memory", "4g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    print(banner(), flush=True)
    base = spark.range(0, args.rows, numPartitions=4)
    kinds = {
        "images": base.select(F.expr(f"unbase64(base64(repeat(cast(id as string), {args.image_bytes // 4})))")
                              .alias("image"), (F.col("id") % 10).alias("label")),
        "floats": base.select(F.expr(f"transform(sequence(1, {args.floats}), i -> cast(id * i % 255 as float))")
                              .alias("pixels"), (F.col("id") % 10).alias("label")),
    }
    results: dict = {"machine": machine(), "rows": args.rows, "rounds": args.rounds, "kinds": {}}
    for kind, df in kinds.items():
        df = df.repartition(2).cache()
        df.count()
        plain, ordered = df, in_canonical_order(df)
        assert read_all(plain) == read_all(ordered) == args.rows
        times = interleaved({"plain": lambda p=plain: read_all(p), "canonical": lambda o=ordered: read_all(o)},
                            rounds=args.rounds)
        a, b = median(times["plain"]), median(times["canonical"])
        results["kinds"][kind] = {"plain_s": a, "canonical_s": b, "ratio": b / a,
                                  "per_row_ms": (b - a) / args.rows * 1e3}
        print(f"{kind}: plain {a:.3f} s, canonical {b:.3f} s, ratio {b / a:.2f}, "
              f"+{(b - a) / args.rows * 1e3:.3f} ms a row ({args.rows} rows, median of {args.rounds})", flush=True)
        df.unpersist()
    spark.stop()
    return finish(args.json, results)


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"{time.time() - t0:.0f} s in all")
