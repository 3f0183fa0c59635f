"""Starting a real local[2] Spark for tests."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile


def local_spark(cores: int = 2):

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    tmp = tempfile.mkdtemp(prefix="tfnet-spark-")
    from optim.spark.session import build_session

    return build_session("tfnet-tests", f"local[{cores}]", {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": str(cores),
        "spark.default.parallelism": str(cores),
        "spark.local.dir": tmp,
        "spark.sql.warehouse.dir": os.path.join(tmp, "warehouse"),
        "spark.driver.host": "127.0.0.1",
        "spark.python.worker.reuse": "true",
        "spark.driver.memory": "3g",
    })


def spark_jobs(spark) -> list[tuple[int, str]]:
    """``(job id, job group or "")`` of every job this Spark application has run or is running,
    oldest first, once Spark's listener bus has delivered the events so far. Read through the JVM's
    status store: PySpark's status tracker lists jobs by group only, and tfnet gives each of its
    jobs a group of its own, ``tfnet-<kind>-<hex>`` (``tfnet-warm-up-*``, ``tfnet-train-*``,
    ``tfnet-probe-*``, ``tfnet-count-*``, ``tfnet-evaluate-*``: :func:`optim.spark.jobs.run_job`)."""
    jsc = spark.sparkContext._jsc.sc()
    jsc.listenerBus().waitUntilEmpty()
    jobs = jsc.statusStore().jobsList(None)
    out = []
    for i in range(jobs.length()):
        job = jobs.apply(i)
        group = job.jobGroup()
        out.append((int(job.jobId()), str(group.get()) if group.isDefined() else ""))
    return sorted(out)


def jobs_since(spark, before: list[tuple[int, str]]) -> list[str]:
    """The groups of the jobs started since ``before`` (a :func:`spark_jobs` list), the workers'
    warm-up (which tfnet starts in the background once per application) left out."""
    seen = set(before)
    return [group for job in spark_jobs(spark) if job not in seen
            for group in [job[1]] if not group.startswith("tfnet-warm-up-")]


def kill_rank_after_checkpoints(model_dir, checkpoints: int, rank: int = 1, deadline_s: float = 240.0,
                                truncate_newest: bool = False) -> dict:
    """From a thread: kills ``rank``'s Python process (SIGKILL) once ``model_dir`` (a local folder)
    holds ``checkpoints`` checkpoints and the rank's ``rank-N.json``, that is mid-training. Returns a
    dict that gets ``pid``, ``after`` (the newest checkpoint then) and has ``thread``. With
    ``truncate_newest``, the newest checkpoint is cut to half its length before the failure, as a crash in the middle
    of a write to a file system without atomic renames would leave it (``truncated`` names it): rank 0, the writer,
    is first stopped (SIGSTOP: no later checkpoint can appear, and one it was writing is never renamed into place),
    the newest is cut, and then ``rank`` and rank 0 are killed. So the retry, whenever it starts, finds the cut file
    newest. (Waiting for rank 0 to die after killing ``rank`` raced with the retry: Spark fails the job before it
    kills the other task's Python worker, up to ``spark.python.task.killTimeout`` later.)"""
    import glob
    import json
    import signal
    import threading
    import time

    assert not (truncate_newest and rank == 0), "rank 0 writes the checkpoints: kill another rank"
    killed: dict = {}

    def pid_of(infos, r):
        with open(os.path.join(os.path.dirname(infos[0]), f"rank-{r}.json")) as f:
            return json.load(f)["pid"]

    def killer():
        deadline = time.time() + deadline_s
        while time.time() < deadline and "pid" not in killed:
            ckpts = glob.glob(os.path.join(model_dir, "checkpoints", "*", "ckpt-*.npz"))
            infos = glob.glob(os.path.join(model_dir, "ranks", "*", f"rank-{rank}.json"))
            if len(ckpts) >= checkpoints and infos:
                pid = pid_of(infos, rank)
                writer = pid_of(infos, 0) if truncate_newest else None
                if writer is not None:
                    os.kill(writer, signal.SIGSTOP)
                    newest = sorted(glob.glob(os.path.join(model_dir, "checkpoints", "*", "ckpt-*.npz")))[-1]
                    with open(newest, "rb") as f:
                        data = f.read()
                    with open(newest, "wb") as f:
                        f.write(data[:len(data) // 2])
                    killed["truncated"] = newest
                os.kill(pid, signal.SIGKILL)
                if writer is not None:
                    os.kill(writer, signal.SIGKILL)
                killed["after"] = sorted(ckpts)[-1]
                killed["pid"] = pid
            time.sleep(0.05)

    killed["thread"] = threading.Thread(target=killer, daemon=True)
    killed["thread"].start()
    return killed


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (on this machine)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def png_frame(spark, n: int, size: int = 64, partitions: int = 2):
    """``n`` PNG-encoded ``size`` x ``size`` x 3 images made by Spark (random pixels seeded by the row id:
    about 12 KB each), with a label of 10 classes (the streaming tests and benchmarks/bench_memory.py)."""
    import numpy as np

    def make(batches):
        import pyarrow as pa
        import tensorflow as tf

        for batch in batches:
            ids = batch.column(0).to_numpy()
            pngs = [tf.io.encode_png(np.random.default_rng(int(i)).integers(0, 256, (size, size, 3), np.uint8)).numpy()
                    for i in ids]
            yield pa.record_batch({"image": pa.array(pngs, pa.binary()), "label": pa.array(ids % 10)})

    return spark.range(0, n, 1, partitions).mapInArrow(make, "image binary, label long")


#: The pool of the tests that compare a retried run with another bit for bit: only their training runs in it.
BIT_FOR_BIT = "bit-for-bit"


@contextlib.contextmanager
def own_python_workers(spark, tag: str):
    """Spark's jobs inside run in Python workers of their own: Spark keys its worker pools by the
    environment it gives them (``SparkContext.environment``), so a new variable starts a new pool. A test
    that compares runs bit for bit needs this, as TensorFlow in a reused worker keeps the thread pools its
    first user gave it (a predictor's defaults, say), and a conv's sums differ with the thread count."""
    env = spark.sparkContext.environment
    env["TFNET_TEST_WORKERS"] = tag
    try:
        yield
    finally:
        env.pop("TFNET_TEST_WORKERS", None)
