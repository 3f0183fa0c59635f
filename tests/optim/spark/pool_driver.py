"""The Python-worker pools of a fresh local[2] Spark, for tests/optim/spark/test_startup.py (a process of
its own, so that no earlier test's jobs have shaped the JVM's pools):

    python -m tests.optim.spark.pool_driver

Prints ``RESULT`` with the PIDs of an RDD job's workers and of DataFrame jobs' workers outside and inside
:func:`optim.spark.session.shared_python_workers`, and the setting seen inside and after."""

import json
import os


def main() -> None:
    import pyarrow as pa

    from optim.spark.session import SIMPLIFIED_TRACEBACK, build_session, shared_python_workers

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = build_session("tfnet-pools", "local[2]", {"spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1",
                                                       "spark.python.worker.reuse": "true"}, warm_up=False)

    def pids(batches):
        for _ in batches:
            pass
        yield pa.RecordBatch.from_pydict({"pid": [os.getpid()]})

    def dataframe_pids():
        return sorted({r.pid for r in spark.range(2, numPartitions=2).mapInArrow(pids, "pid long").collect()})

    out = {"rdd": sorted(set(spark.sparkContext.parallelize(range(2), 2).map(lambda _: os.getpid()).collect()))}
    spark.conf.set(SIMPLIFIED_TRACEBACK, "true")
    out["outside"] = dataframe_pids()
    with shared_python_workers(spark):
        out["inside_setting"] = spark.conf.get(SIMPLIFIED_TRACEBACK)
        out["inside"] = dataframe_pids()
    out["after_setting"] = spark.conf.get(SIMPLIFIED_TRACEBACK)
    spark.conf.unset(SIMPLIFIED_TRACEBACK)
    with shared_python_workers(spark):
        pass
    out["after_unset"] = spark.conf.get(SIMPLIFIED_TRACEBACK, None)
    print("RESULT " + json.dumps(out), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
