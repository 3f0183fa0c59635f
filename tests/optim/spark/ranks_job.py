"""Four Horovod ranks on a local[4] Spark of its own (run by test_sync_modes.py in a subprocess,
since the suite's session is local[2]): a tiny model on digits, each sync mode, and the equal-steps
rule with empty and very uneven partitions. Prints one ``RESULT {json}`` line. (It ran eight ranks
until the suite had to fit 35 minutes on 2 cores; four keep the N-way averages and the empty and
uneven partitions.)

    python -m tests.optim.spark.ranks_job
"""

from __future__ import annotations

import json
import os
import time

RANKS = 4
SIZES = [0, 500, 12, 0]  # the DataFrame's partitions: two empty, one of 12 rows against 500


def tiny_net(seed: int = 0):
    import keras

    from tfnet import TFNet

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((64,), name="pixels"), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(10)])
    return TFNet.from_keras(model)


def main() -> dict:
    import numpy as np

    import optim
    from optim import TFDataset, TFOptimizer
    from tests import digits
    from tests.spark_utils import local_spark

    spark = local_spark(RANKS)
    sce = optim.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = digits.load()
    x = x.reshape(len(x), -1).astype("float32")
    out: dict = {"start_seconds": time.perf_counter() - T0}

    def run(sync, data, epochs=2, batch=64, **kw):
        net = tiny_net()
        opt = TFOptimizer(net, sce, optim.SGD(0.1), metrics=["accuracy"])
        history = opt.optimize(data, epochs=epochs, batch_size=batch, shuffle=False, num_workers=RANKS, verbose=0,
                               sync=sync, timeout=120, **kw)
        return net, opt, history

    # A DataFrame whose 512 rows sit in two of its four partitions (two empty, one of 12 rows):
    # the launcher spreads them over the four ranks (128 each: 8 steps of 16 rows per epoch).
    from pyspark.sql import Row

    sizes = SIZES
    rows = [Row(pixels=x[i].tolist(), label=int(y[i])) for i in range(sum(sizes))]
    chunks, start = [], 0
    for n in sizes:
        chunks.append(rows[start:start + n])
        start += n
    rdd = spark.sparkContext.parallelize(range(RANKS), RANKS).flatMap(lambda i, c=chunks: c[i])
    df = spark.createDataFrame(rdd, "pixels array<float>, label long")
    out["partitions"] = df.rdd.glom().map(len).collect()
    data = TFDataset.from_dataframe(df, "pixels", "label")
    weights = {}
    modes = (("every", None), ("local1", optim.LocalSGD(every=1, server=optim.SGD(1.0))),
             ("local4", optim.LocalSGD(every=4)), ("async", optim.Asynchronous()))
    for name, sync in modes:
        t0 = time.perf_counter()
        net, opt, history = run(sync, data)
        # the nets are built one after another: their Keras names differ, their order does not
        weights[name] = list(net.get_weights().values())
        out[name] = {"rows": opt.last_run["rows"], "steps_per_epoch": opt.last_run["steps_per_epoch"],
                     "global_step": opt.global_step, "loss": history["loss"],
                     "bytes_per_step": history["bytes_per_step"], "seconds": time.perf_counter() - t0}
    for name in ("local1", "local4", "async"):
        out[name]["max_abs_diff"] = max(float(np.max(np.abs(a - b))) for a, b in zip(weights["every"], weights[name]))
    out["params_bytes"] = sum(int(v.size) * 4 for v in weights["every"])
    spark.stop()
    return out


T0 = time.perf_counter()

if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    print("RESULT " + json.dumps(main()), flush=True)
