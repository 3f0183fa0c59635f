"""What each DataFrame action costs on a TFPredictor result, against the same action on a pandas UDF (issue 56).

``local[2]``, 120 rows of 64 floats in 2 partitions, cached; a small CNN. Each action runs on a new DataFrame from
``TFPredictor(net).predict(df)`` and from ``df.withColumn(..., pandas_udf)``, in the same order for both. An action
that leaves a Python worker's output unread (first, take, head, limit) makes Spark drop that worker, so the next
action that needs one forks a fresh worker: for TFPredictor that worker imports TensorFlow and loads the net again.

    python benchmarks/bench_actions.py [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import banner, finish, setup_env  # noqa: E402

ACTIONS = [
    ("count", lambda d: d.count()),
    ("toPandas", lambda d: len(d.toPandas())),
    ("collect", lambda d: len(d.collect())),
    ("limit(4).collect", lambda d: len(d.limit(4).collect())),
    ("head(2)", lambda d: len(d.head(2))),
    ("first", lambda d: d.first() is not None),
    ("toPandas", lambda d: len(d.toPandas())),
    ("count", lambda d: d.count()),
]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    setup_env()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import keras
    from pyspark.sql import SparkSession
    from pyspark.sql.functions import pandas_udf

    from optim import TFPredictor
    from tfnet import TFNet

    print(banner())
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1), name="image"), keras.layers.Conv2D(16, 3, activation="relu"),
                              keras.layers.Flatten(), keras.layers.Dense(10)])
    net = TFNet.from_keras(model)
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    df = spark.createDataFrame([([float(i % 7) / 7] * 64, i % 10) for i in range(120)],
                               "pixels array<float>, label long").repartition(2)
    df.cache().count()
    predictor = TFPredictor(net, batch_per_thread=32)

    @pandas_udf("double")
    def column(s):
        return s.astype("float64")

    out: dict = {"banner": banner(), "seconds": {}}
    for side, make in [("pandas_udf", lambda: df.withColumn("o", column("label"))),
                       ("tfpredictor", lambda: predictor.predict(df, feature_cols="pixels"))]:
        rows = []
        for name, action in ACTIONS:
            t0 = time.perf_counter()
            action(make())
            rows.append((name, round(time.perf_counter() - t0, 2)))
        out["seconds"][side] = rows
    print(f"{'action':18} {'pandas UDF':>10} {'TFPredictor':>12}")
    for (name, a), (_, b) in zip(out["seconds"]["pandas_udf"], out["seconds"]["tfpredictor"]):
        print(f"{name:18} {a:10.2f} {b:12.2f}")
    spark.stop()
    finish(args.json, out)
    return out


if __name__ == "__main__":
    main()
