"""A user's driver script for tests/optim/spark/test_launch_paths.py, run as its own process:

    python -m tests.optim.spark.launch_driver MODE MODEL_DIR EPOCHS [CONNECT_URL]

MODE ``classic``: a classic local[2] session. ``connect``: a Spark Connect client of the server at
CONNECT_URL. ``in-process-connect``: what ``SparkSession.builder.remote("local[2]")`` makes (a Connect
server whose JVM runs in this process, so its console is this one; started here with the same
plugin on port 0 instead of pyspark's fixed 15002), and a client of it. It fine-tunes the digits CNN
on 2 ranks with ``model_dir`` and a checkpoint every 4 steps at ``verbose=1``, and prints ``RESULT``
and the run's summary at the end. Like a notebook or a REPL, it survives Ctrl-C: it prints
``INTERRUPTED`` and waits (until its standard input closes) with the session still open.
"""

import json
import os
import signal
import sys


def session(mode: str, url: str | None):
    from pyspark.sql import SparkSession

    if mode == "classic":
        from tests.spark_utils import local_spark

        return local_spark(2)
    if mode == "connect":
        return SparkSession.builder.remote(url).create()
    from pyspark import SparkConf, SparkContext

    conf = (SparkConf().setMaster("local[2]").setAppName("tfnet-in-process-connect")
            .set("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin")
            .set("spark.connect.grpc.binding.port", "0").set("spark.connect.grpc.binding.address", "127.0.0.1")
            .set("spark.driver.host", "127.0.0.1").set("spark.ui.enabled", "false"))
    sc = SparkContext(conf=conf)
    service = getattr(getattr(sc._jvm.org.apache.spark.sql.connect.service, "SparkConnectService$"), "MODULE$")
    return SparkSession.builder.remote(f"sc://127.0.0.1:{service.localPort()}").create()


def main() -> None:
    mode, model_dir, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    spark = session(mode, sys.argv[4] if len(sys.argv) > 4 else None)
    # The process's own Ctrl-C handler, not the one pyspark's SparkContext installs when it starts on the
    # main thread (that one cancels every job of the context): a shell or framework installs its own, and
    # a context started off the main thread has none. tfnet must end its stage either way.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import optim
    from optim import TFOptimizer
    from tests import digits
    from tfnet import TFNet

    x, y = digits.load()
    net = TFNet.from_keras(digits.cnn(classes=10, seed=0))
    opt = TFOptimizer(net, optim.losses.SparseCategoricalCrossentropy(from_logits=True), optim.SGD(0.05),
                      model_dir=model_dir)
    print(f"STARTED {os.getpid()} {type(spark).__module__}", flush=True)
    try:
        opt.optimize((x[:256], y[:256]), epochs=epochs, batch_size=32, num_workers=2, checkpoint_every=4, verbose=1)
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
        sys.stdin.read()  # a notebook's kernel lives on after Ctrl-C, and so does its session
        return
    print("RESULT " + json.dumps({"mode": opt.last_run["mode"], "step": opt.global_step}), flush=True)


if __name__ == "__main__":
    main()
