"""A user's driver script for tests/optim/spark/test_elastic.py, run as its own process against a
standalone cluster (MASTER_URL ``spark://...``), or as a Spark Connect client of a server on that cluster
(``sc://...``):

    python -m tests.optim.spark.elastic_driver MASTER_URL MODEL_DIR EPOCHS MIN_WORKERS ELASTIC_WAIT STEP_SLEEP [THEN_DIR]

It fine-tunes the digits CNN on 1,024 rows as a DataFrame (2 ranks wanted, global batch 32, Adam) and
prints ``RESULT`` with the run's summary and the accuracy on the other 773 rows (held out). Given
THEN_DIR, the same application then makes a second run there, of 6 epochs with ``min_workers=2`` and an
``elastic_wait`` of 5 s (a test ends it by taking a worker away). STEP_SLEEP > 0
makes every step that much slower (an update hook that sleeps; the numbers are unchanged), so that a
test has time to change the cluster during the run. A run that ends in a DistributedTrainingError prints
``RESULT_ERROR`` (or ``THEN_ERROR``) instead.
"""

import json
import os
import sys
import time


def main() -> None:
    url, model_dir, epochs, min_workers, wait, sleep = sys.argv[1:7]
    then = sys.argv[7] if len(sys.argv) > 7 else None
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    if url.startswith("sc://"):  # a Spark Connect client (the server runs on the cluster)
        spark = SparkSession.builder.remote(url).create()
    else:
        spark = (SparkSession.builder.master(url).appName("tfnet-elastic-test")
                 .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false")
                 .config("spark.executor.memory", "1g").config("spark.executor.cores", "1")
                 .config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2").getOrCreate())
    import tensorflow as tf

    import optim
    from optim import TFDataset, TFOptimizer
    from optim.errors import DistributedTrainingError
    from tests import digits
    from tfnet import TFNet

    x, y = digits.load()
    df = spark.createDataFrame([(x[i].ravel().tolist(), int(y[i])) for i in range(1024)],
                               "pixels array<float>, label long").repartition(2)
    data = TFDataset.from_dataframe(df, "pixels", "label", feature_shapes={"pixels": (8, 8, 1)})

    def run(where: str, min_workers: int, step_sleep: float, epochs: int, wait: float) -> dict:
        net = TFNet.from_keras(digits.cnn(10, seed=0))
        if step_sleep > 0:
            net.register_update_hook(lambda w: tf.py_function(lambda: time.sleep(step_sleep), [], []) and None)
        opt = TFOptimizer(net, optim.losses.SparseCategoricalCrossentropy(from_logits=True), optim.Adam(0.005),
                          metrics=["accuracy"], model_dir=where)
        history = opt.optimize(data, epochs=epochs, batch_size=32, num_workers=2, min_workers=min_workers,
                               elastic_wait=wait, checkpoint_every=8, verbose=2, timeout=60, max_retries=2)
        held_out = opt.evaluate((x[1024:], y[1024:]), batch_size=256)["accuracy"]
        return {"step": opt.global_step, "last_run": opt.last_run, "history": history, "held_out": held_out}

    for label, args in (("RESULT", (model_dir, int(min_workers), float(sleep), int(epochs), float(wait))),
                        ("THEN", (then, 2, 0.0, 6, 5.0))):
        if args[0] is None:
            break
        try:
            print(f"{label} " + json.dumps(run(*args)), flush=True)
        except DistributedTrainingError as exc:
            print(f"{label}_ERROR " + json.dumps({"type": type(exc).__name__, "message": str(exc)}), flush=True)


if __name__ == "__main__":
    main()
