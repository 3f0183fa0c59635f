"""What each DataFrame action costs on a TFPredictor result, against the same action on a pandas UDF (issue 56).

``local[2]``, 120 rows of 64 floats in 2 partitions, cached; a small CNN. Each action runs on a new DataFrame from
``TFPredictor(net).predict(df)`` and from ``df.withColumn(..., pandas_udf)``, in the same order for both. An action
that leaves a Python worker's output unread (first, take, head, limit) makes Spark drop that worker, so the next
action that needs one forks a fresh worker: for TFPredictor that worker imports TensorFlow and loads the net again.

TFPredictor's workers run three ways, side by side: forked by pyspark's own daemon as ``import tfnet`` starts them
(Keras left unloaded); the same with ``TFNET_EAGER_KERAS=1`` (TensorFlow's own import, which loads all of Keras); and
forked by tfnet's daemon, which imported TensorFlow before it forks (``spark.python.daemon.module =
optim.spark.worker_daemon``). A fresh worker's start is most of what an action after an unread one costs.

    python benchmarks/bench_actions.py [--rounds 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
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


#: Each side's Spark settings. TFPredictor's Python workers as ``import tfnet`` starts them (Keras left unloaded:
#: tfnet.quiet.without_eager_keras), with TensorFlow's own import, which loads all of Keras (``TFNET_EAGER_KERAS=1``),
#: and forked with TensorFlow imported (optim.spark.worker_daemon), side by side; the others under pyspark's daemon.
STOCK = {"spark.python.daemon.module": "pyspark.daemon"}
SIDES = [("pandas_udf", STOCK), ("tfpredictor_eager_keras", {**STOCK, "spark.executorEnv.TFNET_EAGER_KERAS": "1"}),
         ("tfpredictor", STOCK), ("tfpredictor_worker_daemon", {"spark.python.daemon.module": "optim.spark.worker_daemon"})]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2, help="rounds of every side, in alternation (default 2)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    setup_env()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import keras
    from pyspark.sql import SparkSession
    from pyspark.sql.functions import pandas_udf
    from pyspark.sql.types import DoubleType

    from optim import TFPredictor
    from tfnet import TFNet

    print(banner())
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1), name="image"), keras.layers.Conv2D(16, 3, activation="relu"),
                              keras.layers.Flatten(), keras.layers.Dense(10)])
    net = TFNet.from_keras(model)

    @pandas_udf(DoubleType())  # (a type, not "double": no session is active yet)
    def column(s):
        return s.astype("float64")

    out: dict = {"banner": banner(), "seconds": {}, "rounds": args.rounds}
    for _ in range(args.rounds):
        for side, conf in SIDES:
            # a Spark application of its own for each side and round: fresh Python workers with the side's settings
            builder = SparkSession.builder.master("local[2]").config("spark.ui.showConsoleProgress", "false")
            for key, value in conf.items():
                builder = builder.config(key, value)
            spark = builder.getOrCreate()
            df = spark.createDataFrame([([float(i % 7) / 7] * 64, i % 10) for i in range(120)],
                                       "pixels array<float>, label long").repartition(2)
            df.cache().count()
            predictor = TFPredictor(net, batch_per_thread=32)
            rows = []
            for name, action in ACTIONS:
                t0 = time.perf_counter()
                action(df.withColumn("o", column("label")) if side == "pandas_udf" else
                       predictor.predict(df, feature_cols="pixels"))
                rows.append((name, round(time.perf_counter() - t0, 2)))
            spark.stop()
            out["seconds"].setdefault(side, []).append(rows)
    sides = list(out["seconds"])
    medians = {side: [statistics.median(rounds[k][i][1] for k in range(args.rounds)) for i in range(len(ACTIONS))]
               for side, rounds in out["seconds"].items()}
    out["median_seconds"] = {side: dict(zip([f"{i} {n}" for i, (n, _) in enumerate(ACTIONS)], m))
                             for side, m in medians.items()}
    out["total_seconds"] = {side: round(sum(m), 2) for side, m in medians.items()}
    out["eager_keras_over_tfnet"] = round(out["total_seconds"]["tfpredictor_eager_keras"]
                                          / out["total_seconds"]["tfpredictor"], 3)
    print(f"medians of {args.rounds} round(s), seconds an action, each on a new DataFrame (Spark local[2])")
    print(f"{'action':18}" + "".join(f"{side:>26}" for side in sides))
    for i, (name, _) in enumerate(ACTIONS):
        print(f"{name:18}" + "".join(f"{medians[side][i]:26.2f}" for side in sides))
    print(f"{'all':18}" + "".join(f"{out['total_seconds'][side]:26.2f}" for side in sides))
    out["stock_daemon_over_worker_daemon"] = round(out["total_seconds"]["tfpredictor"]
                                                   / out["total_seconds"]["tfpredictor_worker_daemon"], 3)
    print(f"TensorFlow's own import (Keras loaded) / tfnet's, all actions: {out['eager_keras_over_tfnet']}")
    print(f"pyspark's daemon / tfnet's (optim.spark.worker_daemon), all actions: "
          f"{out['stock_daemon_over_worker_daemon']}")
    finish(args.json, out)
    return out


if __name__ == "__main__":
    main()
