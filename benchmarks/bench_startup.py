"""Startup time of distributed training on Spark local[2]: from the call of optimize() to the
first training step, with TensorFlow already imported in the driver.

Each case runs in a fresh Spark application (fresh Python workers), side by side in one run:

* a plain barrier stage whose tasks only import TensorFlow (TorchDistributor-style start-up: the
  least any TensorFlow-on-Spark launcher pays);
* tfnet with fresh workers and no warm-up (``build_session(warm_up=False)``), then a second call
  with the workers warm;
* tfnet's default: the workers start importing when tfnet creates the session, and the driver works
  ``--prepare-s`` seconds (building the model and the data) before ``optimize()``;
* horovod.spark.run, timed from its call to the moment both ranks have run hvd.init() (in the last
  application, its workers warm).

    python benchmarks/bench_startup.py [--prepare-s 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import banner, finish, machine, setup_env  # noqa: E402


def _horovod_spark_run() -> float | None:
    try:
        import horovod.spark
    except Exception as exc:  # noqa: BLE001
        print(f"horovod.spark.run: not available ({type(exc).__name__}: {exc})")
        return None

    def fn():
        import time as _t

        import horovod.tensorflow as hvd

        hvd.init()
        return _t.time()

    t0 = time.time()
    try:
        stamps = horovod.spark.run(fn, num_proc=2, verbose=0)
    except Exception as exc:  # noqa: BLE001
        print(f"horovod.spark.run failed: {type(exc).__name__}: {str(exc)[:300]}")
        return None
    return max(stamps) - t0


def _plain_barrier_s(spark) -> float:
    """TorchDistributor-style start-up: one barrier stage whose tasks only import TensorFlow (what
    any TensorFlow-on-Spark launcher must pay), from the call to the stage's end."""

    def body(_):
        import tensorflow  # noqa: F401
        from pyspark import BarrierTaskContext

        BarrierTaskContext.get().barrier()
        yield 1

    t0 = time.monotonic()
    spark.sparkContext.parallelize(range(2), 2).barrier().mapPartitions(body).collect()
    return time.monotonic() - t0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json", default=None)
    p.add_argument("--prepare-s", type=float, default=5.0,
                   help="seconds of driver work between the session and optimize() in the 'session warm-up' case")
    p.add_argument("--no-horovod-spark", action="store_true")
    args = p.parse_args(argv)
    setup_env(True)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    import tensorflow as tf  # noqa: F401 - "once TensorFlow is imported"

    import optim
    from optim import TFOptimizer
    from optim.spark.session import build_session
    from tests import digits
    from tfnet import TFNet

    x, y = digits.load()
    out = {"machine": machine()}

    def session(warm_up: bool):
        """A fresh Spark application (fresh Python workers), up and idle."""
        spark = build_session("tfnet-startup", "local[2]", {"spark.ui.enabled": "false",
                                                           "spark.driver.host": "127.0.0.1"}, warm_up=warm_up)
        spark.range(2).count()  # the JVM and the scheduler are up
        return spark

    def tfnet_startup() -> float:
        opt = TFOptimizer(TFNet.from_keras(digits.cnn(10)), optim.losses.SparseCategoricalCrossentropy(True),
                          optim.SGD(0.05))
        opt.optimize((x[:256], y[:256]), epochs=1, batch_size=32, num_workers=2, verbose=0)
        return opt.last_run["startup_s"]

    print(banner(), flush=True)
    spark = session(warm_up=False)
    out["plain_barrier_cold_s"] = _plain_barrier_s(spark)
    print(f"plain barrier stage importing TensorFlow, fresh workers: {out['plain_barrier_cold_s']:.2f} s", flush=True)
    spark.stop()

    spark = session(warm_up=False)
    out["tfnet_cold_s"] = tfnet_startup()
    print(f"tfnet, fresh workers, no warm-up: {out['tfnet_cold_s']:.2f} s from optimize() to the first step",
          flush=True)
    out["tfnet_warm_s"] = tfnet_startup()
    print(f"tfnet, warm workers (a second call): {out['tfnet_warm_s']:.2f} s", flush=True)
    spark.stop()

    spark = session(warm_up=True)  # tfnet's default: the workers import as soon as the session exists
    time.sleep(args.prepare_s)  # the driver prepares the model and the data meanwhile
    out["tfnet_session_warm_up_s"] = tfnet_startup()
    print(f"tfnet, fresh workers warming up since the session started, {args.prepare_s:.0f} s of driver work before "
          f"optimize(): {out['tfnet_session_warm_up_s']:.2f} s", flush=True)
    if not args.no_horovod_spark:
        t = _horovod_spark_run()
        out["horovod_spark_run_s"] = t
        if t is not None:
            print(f"horovod.spark.run (workers already warm): {t:.2f} s from the call to hvd.init() done on both ranks")
    finish(args.json, out)
    spark.stop()
    return out


if __name__ == "__main__":
    main()
