"""A user's driver script for tests/optim/spark/test_hosts.py, run as its own process on the test
network's root host against a cluster whose workers are hosts of their own (:mod:`tests.netns_cluster`):

    python -m tests.optim.spark.hosts_driver MASTER_URL DRIVER_HOST MODEL_DIR S3_ENDPOINT EPOCHS MIN_WORKERS ELASTIC_WAIT STEP_SLEEP [TIMEOUT]

It fine-tunes the digits CNN on 1,024 rows as a DataFrame (2 ranks wanted, global batch 32, Adam) with
``model_dir`` on the S3 server at S3_ENDPOINT (dummy keys, given as ``storage_options``), and prints
``RESULT`` with the run's summary, the accuracy on the other 773 rows (held out) and when it printed. STEP_SLEEP > 0
makes every step that much slower (an update hook that sleeps; the numbers are unchanged), so that a
test has time to lose a host during the run. TIMEOUT: the seconds a rank may go without a step (default 60).
"""

import json
import os
import sys
import time


def main() -> None:
    url, host, model_dir, endpoint, epochs, min_workers, wait, sleep = sys.argv[1:9]
    timeout = float(sys.argv[9]) if len(sys.argv) > 9 else 60.0
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(url).appName("tfnet-hosts-test")
             .config("spark.driver.host", host).config("spark.driver.bindAddress", host)
             .config("spark.ui.enabled", "false")
             .config("spark.executor.memory", "1g").config("spark.executor.cores", "1")
             .config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2").getOrCreate())
    import tensorflow as tf

    import optim
    from optim import TFDataset, TFOptimizer
    from tests import digits
    from tfnet import TFNet

    x, y = digits.load()
    df = spark.createDataFrame([(x[i].ravel().tolist(), int(y[i])) for i in range(1024)],
                               "pixels array<float>, label long").repartition(2)
    data = TFDataset.from_dataframe(df, "pixels", "label", feature_shapes={"pixels": (8, 8, 1)})
    net = TFNet.from_keras(digits.cnn(10, seed=0))
    step_sleep = float(sleep)
    if step_sleep > 0:
        net.register_update_hook(lambda w: tf.py_function(lambda: time.sleep(step_sleep), [], []) and None)
    options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
    opt = TFOptimizer(net, optim.losses.SparseCategoricalCrossentropy(from_logits=True), optim.Adam(0.005),
                      metrics=["accuracy"], model_dir=model_dir, storage_options=options)
    history = opt.optimize(data, epochs=int(epochs), batch_size=32, num_workers=2, min_workers=int(min_workers),
                           elastic_wait=float(wait), checkpoint_every=8, keep_checkpoints=1000, verbose=2,
                           timeout=timeout, max_retries=2)
    held_out = opt.evaluate((x[1024:], y[1024:]), batch_size=256)["accuracy"]
    trainable = sum(int(v.shape.num_elements()) for v in net.trainable_variables)
    print("RESULT " + json.dumps({"step": opt.global_step, "last_run": opt.last_run, "history": history,
                                  "held_out": held_out, "trainable": trainable, "time": time.time()}), flush=True)
    # After a partition Spark's shutdown takes 90 s more (a host it cannot reach); the test has what it needs. The
    # driver's JVM is a child that holds this process's stdout and stderr, so it ends too: with it left to shut
    # down, the test's read of the pipes waited for it in about one run out of two (the test took 160 s, not 70 s)
    sys.stdout.flush(), sys.stderr.flush()
    jvm = getattr(spark.sparkContext._gateway, "proc", None)
    if jvm is not None:
        jvm.kill()
    os._exit(0)


if __name__ == "__main__":
    main()
