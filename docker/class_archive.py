"""Makes a class-data archive (AppCDS) of the classes a Spark driver loads, which a JVM started with
``-XX:SharedArchiveFile=OUT`` then maps instead of reading, parsing and verifying them class by class.

    python class_archive.py OUT.jsa [--base BASE.jsa]

A JVM of Spark's (``spark-submit``, through PySpark's launcher) runs what a tfnet job asks of a driver: SQL with a
shuffle, a DataFrame from Python rows, Arrow both ways, Parquet, a barrier stage; at its exit it writes every class it
loaded on top of the JDK's own archive (``-XX:ArchiveClassesAtExit``; ``--base`` names that one where the JVM's default
options name another). The file appears whole, by a rename, once the JVM has exited. Standard library and PySpark
only: the image's build runs it (docker/Dockerfile) and so do the tests (tests/spark_jvm.py). A JVM maps the archive
only where its class path starts with this one's (Spark's ``spark-class`` gives every driver, executor, master and
worker the same) and every directory on it is empty; elsewhere it runs as before."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

#: Longest wait for the JVM's exit (it writes the archive then: a few seconds).
EXIT_TIMEOUT_S = 120.0


def workload(spark, folder: str) -> None:
    from pyspark.sql import functions as F

    df = spark.createDataFrame([(i, float(i), [0.5] * 4) for i in range(2000)], "id long, x double, v array<float>")
    df.groupBy((F.col("id") % 7).alias("k")).agg(F.sum("x"), F.count("*")).collect()
    df.mapInArrow(lambda batches: batches, df.schema).count()
    df.toPandas()
    path = os.path.join(folder, "table")
    df.write.mode("overwrite").parquet(path)
    spark.read.parquet(path).filter("id > 5").select("v").collect()
    df.rdd.barrier().mapPartitions(lambda rows: [sum(1 for _ in rows)]).collect()


def make(out: str, base: str | None = None) -> None:
    """Runs :func:`workload` in a fresh driver JVM that writes its classes to ``out`` as it exits."""
    if base and not os.path.isfile(base):
        raise SystemExit(f"class_archive: no base archive at {base}")
    partial = f"{out}.{os.getpid()}.partial"
    # The client compiler alone (C1): the archive holds the classes loaded, which the JIT does not change (190.7 MB
    # either way); the dump's JVM took 58 CPU-s with C2 and 47 with C1 alone, 45 s of wall either way (2-core Zen 3,
    # docs/benchmarks.md, 2026-12-07). The suite's JVMs and the image build each run one dump.
    flags = [f"-XX:ArchiveClassesAtExit={partial}", "-XX:TieredStopAtLevel=1", "-Xlog:cds=off", "-Xlog:cds+dynamic=off"]
    if base:
        flags.insert(0, f"-XX:SharedArchiveFile={base}")
    os.environ["SPARK_SUBMIT_OPTS"] = " ".join(filter(None, [os.environ.get("SPARK_SUBMIT_OPTS", ""), *flags]))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    try:
        spark = SparkSession.builder.master("local[2]").config("spark.ui.showConsoleProgress", "false").getOrCreate()
    except Exception as e:  # Java missing or refusing its options: PySpark's own error, in one line
        raise SystemExit(f"class_archive: no archive at {out}: Spark's JVM did not start: {str(e).splitlines()[0]}") from None
    jvm = SparkContext._gateway.proc  # spark-submit's JVM: it exits when its standard input closes
    try:
        with tempfile.TemporaryDirectory(prefix="tfnet-cds-") as folder:
            workload(spark, folder)
        spark.stop()
    finally:
        jvm.stdin.close()  # the JVM writes the archive as it exits, whether the workload ran or not
        try:
            code = jvm.wait(EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            jvm.kill()
            code = None
    try:
        if code != 0 or not os.path.exists(partial):
            ended = f"exited with {code}" if code is not None else f"had not exited after {EXIT_TIMEOUT_S:.0f} s (killed)"
            raise SystemExit(f"class_archive: no archive at {out}: the JVM {ended}")
        os.replace(partial, out)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    print(f"class_archive: {out}, {os.path.getsize(out) / 2**20:.0f} MiB")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="class_archive.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="the archive to write")
    p.add_argument("--base", help="the JDK's archive to build on, where the JVM's default options name another")
    args = p.parse_args(argv)
    make(args.out, args.base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
