"""A user's driver script for tests/optim/spark/test_elastic.py, run as its own process against a
standalone cluster (MASTER_URL ``spark://...``), or as a Spark Connect client of a server on that cluster
(``sc://...``):

    python -m tests.optim.spark.elastic_driver MASTER_URL MODEL_DIR EPOCHS MIN_WORKERS ELASTIC_WAIT STEP_SLEEP
        [--then THEN_DIR] [--reference] [--resume]

It fine-tunes the digits CNN on 1,024 rows as a DataFrame (2 ranks wanted, global batch 32, Adam, a checkpoint every
8 steps, all kept) and prints ``RESULT`` with the run's summary and the accuracy on the other 773 rows (held out).
STEP_SLEEP > 0 makes every step that much slower while the file ``MODEL_DIR.pace`` is there (an update hook that
sleeps; the numbers are unchanged; the driver makes the file, a test removes it when it has seen what it waited for),
so that a test has time to change the cluster during the run, and the rest of the run goes at full speed. A classic
session checks for lost and returned task slots every 0.5 s (``spark.tfnet.slotCheckInterval``,
``spark.tfnet.elastic.growCheckInterval``); a Connect client keeps the server's settings (its check for returned slots
is a probe job that waits for a free slot: more often is no sooner). A run that ends in a DistributedTrainingError
prints ``RESULT_ERROR`` (or ``THEN_ERROR``) instead, with the time it ended.

* ``--then THEN_DIR``: the same application then makes a second run there, of 6 epochs with ``min_workers=2`` and an
  ``elastic_wait`` of 5 s (a test ends it by taking a worker away: ``THEN_ERROR``), and then resumes it
  (``resume=True``, ``min_workers=1``) on the slots left: ``RESUMED``.
* ``--reference``: then an uninterrupted run on one rank from the checkpoint the RESULT run last resumed from (its
  shrink), in ``MODEL_DIR-reference``: ``REFERENCE``.
* ``--resume``: the run continues the newest run in MODEL_DIR (``resume=True``; a driver that was killed).
"""

import argparse
import json
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("url", "model_dir", "epochs", "min_workers", "wait", "sleep"):
        parser.add_argument(name)
    parser.add_argument("--then")
    parser.add_argument("--reference", action="store_true")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    os.environ["PYSPARK_PYTHON"] = os.environ.get("PYSPARK_PYTHON") or __import__("sys").executable
    from pyspark.sql import SparkSession

    if args.url.startswith("sc://"):  # a Spark Connect client (the server runs on the cluster)
        spark = SparkSession.builder.remote(args.url).create()
    else:
        spark = (SparkSession.builder.master(args.url).appName("tfnet-elastic-test")
                 .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false")
                 .config("spark.executor.memory", "1g").config("spark.executor.cores", "1")
                 .config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
                 .config("spark.tfnet.slotCheckInterval", "0.5s")
                 .config("spark.tfnet.elastic.growCheckInterval", "0.5s").getOrCreate())
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

    def run(where: str, min_workers: int, step_sleep: float, epochs: int, wait: float, num_workers: int = 2,
            **kw) -> dict:
        net = TFNet.from_keras(digits.cnn(10, seed=0))
        if step_sleep > 0:
            pace = where + ".pace"
            open(pace, "w").close()

            def pause(pace=pace, step_sleep=step_sleep):
                if os.path.exists(pace):
                    time.sleep(step_sleep)

            net.register_update_hook(lambda w: tf.py_function(pause, [], []) and None)
        opt = TFOptimizer(net, optim.losses.SparseCategoricalCrossentropy(from_logits=True), optim.Adam(0.005),
                          metrics=["accuracy"], model_dir=where)
        history = opt.optimize(data, epochs=epochs, batch_size=32, num_workers=num_workers, min_workers=min_workers,
                               elastic_wait=wait, checkpoint_every=8, keep_checkpoints=1000, verbose=2, timeout=60,
                               max_retries=2, **kw)
        held_out = opt.evaluate((x[1024:], y[1024:]), batch_size=256)["accuracy"]
        return {"step": opt.global_step, "last_run": opt.last_run, "history": history, "held_out": held_out,
                "time": time.time()}

    def say(label: str, fn) -> bool:
        try:
            print(f"{label} " + json.dumps(fn()), flush=True)
            return True
        except DistributedTrainingError as exc:
            print(f"{label}_ERROR " + json.dumps({"type": type(exc).__name__, "message": str(exc), "time": time.time()}),
                  flush=True)
            return False

    # a new application's executors take seconds to register: the resumed run waits for them (then starts smaller)
    main_kw = {"resume": True, "slot_wait": 8.0} if args.resume else {}
    result: dict = {}

    def first() -> dict:
        result.update(run(args.model_dir, int(args.min_workers), float(args.sleep), int(args.epochs), float(args.wait),
                          **main_kw))
        return result

    if say("RESULT", first) and args.reference:
        say("REFERENCE", lambda: run(args.model_dir + "-reference", 1, float(args.sleep), int(args.epochs), 0.0,
                                     num_workers=1, resume=result["last_run"]["resumed_from"]))
    if args.then and not say("THEN", lambda: run(args.then, 2, 0.0, 6, 5.0)):
        # the slot left is the application's already: no wait for more (the lost one is known lost: THEN_ERROR)
        say("RESUMED", lambda: run(args.then, 1, 0.0, 6, 5.0, resume=True, slot_wait=0.5))


if __name__ == "__main__":
    main()
