"""Startup time of distributed training on Spark local[2]: from the call of optimize() to the
first training step, with TensorFlow already imported in the driver.

Reported for cold Python workers (the first distributed call of a Spark application: the workers
import TensorFlow) and warm ones (a second call). For comparison, horovod.spark.run is timed from
its call to the moment both ranks have run hvd.init(), in the same Spark session.

    python benchmarks/bench_startup.py [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import machine, setup_env, write_json  # noqa: E402


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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json", default=None)
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

    spark = build_session("tfnet-startup", "local[2]", {"spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1"})
    spark.range(2).count()  # the JVM and the scheduler are up
    x, y = digits.load()
    out = {"machine": machine()}
    for label in ("cold", "warm"):
        opt = TFOptimizer(TFNet.from_keras(digits.cnn(10)), optim.losses.SparseCategoricalCrossentropy(True),
                          optim.SGD(0.05))
        opt.optimize((x[:256], y[:256]), epochs=1, batch_size=32, num_workers=2, verbose=0)
        out[f"tfnet_{label}_s"] = opt.last_run["startup_s"]
        print(f"tfnet, {label} workers: {opt.last_run['startup_s']:.2f} s from optimize() to the first step")
    if not args.no_horovod_spark:
        t = _horovod_spark_run()
        out["horovod_spark_run_s"] = t
        if t is not None:
            print(f"horovod.spark.run: {t:.2f} s from the call to hvd.init() done on both ranks")
    write_json(args.json, out)
    spark.stop()
    return out


if __name__ == "__main__":
    main()
