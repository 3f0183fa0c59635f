"""Checks before the training stage starts, and warming the workers up. Driver side.

Task slots (a barrier stage needs one per rank), Horovod on the driver, and one small probe task
per slot that imports what the ranks need and reports what failed, as clear errors.
"""

from __future__ import annotations

import threading
import time
import uuid

from optim.errors import DistributedTrainingError, SparkSetupError
from optim.spark.driver.retry import stage_error
from optim.spark.session import get_spark

__all__ = ["WarmUp", "bounded_job", "check_driver_horovod", "check_model_dir", "ensure_warm_up", "probe_workers",
           "task_slots", "wait_for_slots", "warm_up_workers"]


def task_slots(sc) -> int:
    """How many tasks the cluster can run at once (a barrier stage needs one slot per rank)."""
    jsc = sc._jsc.sc()
    try:
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception:  # noqa: BLE001 - py4j surface differs across versions
        return int(sc.defaultParallelism)


def wait_for_slots(sc, needed: int, wait_s: float) -> int:
    deadline = time.monotonic() + wait_s
    slots = task_slots(sc)
    while slots < needed and time.monotonic() < deadline:
        time.sleep(1.0)
        slots = task_slots(sc)
    return slots


def check_driver_horovod() -> None:
    try:
        import horovod.tensorflow as hvd  # noqa: F401
        from horovod.runner.http.http_server import RendezvousServer  # noqa: F401
    except ImportError as exc:
        raise SparkSetupError(
            f"Horovod is not installed in this Python ({exc}). Distributed training needs Horovod 0.28.1 "
            "built with TensorFlow and Gloo: run `bash scripts/build_horovod.sh .venv/bin/python` "
            "(make install does it)."
        ) from None


def _import_report_fn(probe: tuple | None = None):
    """The probe task: imports what the ranks need in a Python worker and reports what failed,
    and, given ``probe = (path, storage_options)``, whether the worker can read that file (the
    driver's marker in ``model_dir``). Made here, not at module level, so that cloudpickle ships it
    by value: a worker whose Python lacks tfnet must still run it and say so, not fail to unpickle it."""

    def import_report(_) -> list[dict]:
        import socket
        import sys

        report = {"python": sys.executable, "host": socket.gethostname()}
        try:  # TensorFlow first, with its start-up banner kept out of the executor's stderr
            from optim.logs import import_tensorflow

            import_tensorflow()
        except Exception:  # noqa: BLE001 - the loop below reports what cannot be imported
            pass
        for module in ("tfnet", "optim", "tensorflow", "horovod.tensorflow"):
            try:
                __import__(module)
            except Exception as exc:  # noqa: BLE001 - reported back to the driver
                report[module] = f"{type(exc).__name__}: {exc}"
        if "horovod.tensorflow" not in report:
            import horovod.tensorflow as hvd

            if not hvd.gloo_built():
                report["horovod.tensorflow"] = "built without Gloo"
        if probe is not None and "tfnet" not in report:
            try:
                from tfnet import storage

                if not storage.exists(probe[0], probe[1]):
                    report["model_dir"] = f"{probe[0]} is not there (not the driver's storage)"
            except Exception as exc:  # noqa: BLE001 - reported back to the driver
                report["model_dir"] = f"{type(exc).__name__}: {exc}"
        return [report]

    return import_report


class WarmUp:
    """A running :func:`warm_up_workers` job: ``wait(timeout)`` blocks until it is done and
    returns the workers' reports (``{"python": executable, module: error, ...}``), or None if it
    is still running."""

    def __init__(self, sc, n: int):
        self.reports: list[dict] = []
        self.error: BaseException | None = None
        self._sc, self._n = sc, n
        self._thread = threading.Thread(target=self._run, name="tfnet-warm-up", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._sc.setJobGroup(f"tfnet-warm-up-{uuid.uuid4().hex[:8]}", "tfnet: warming up the workers' Python",
                                 interruptOnCancel=True)
            self.reports = self._sc.parallelize(range(self._n), self._n).mapPartitions(_import_report_fn()).collect()
        except Exception as exc:  # noqa: BLE001 - optimize() checks the workers and says what is wrong
            self.error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout: float = 600.0) -> list[dict] | None:
        """The reports, or None when the job is still running after ``timeout`` seconds (default 600)."""
        self._thread.join(timeout)
        return None if self._thread.is_alive() else self.reports


def warm_up_workers(spark=None, num_workers: int | None = None) -> WarmUp:
    """Starts, in the background, one small Spark job per task slot that imports TensorFlow,
    Horovod and tfnet in the Python workers, and returns at once.

    The first distributed ``optimize()`` of a Spark application otherwise waits for every
    worker to import TensorFlow (most of its start-up time: about 12 s on 2 cores). Call this
    right after making the session and go on preparing data or a model on the driver;
    ``optimize()`` then finds the workers warm (with Spark's default
    ``spark.python.worker.reuse``). Errors are not raised here: ``optimize()`` checks the
    workers and reports them.

    Example:
        >>> session = SparkSession.builder.getOrCreate()        # doctest: +SKIP
        >>> optim.warm_up_workers(session)                      # doctest: +SKIP
        >>> ...  # build the model and the data on the driver
        >>> opt.optimize(data, num_workers=2)                   # doctest: +SKIP
    """
    spark = spark or get_spark()
    sc = spark.sparkContext if hasattr(spark, "sparkContext") else spark
    warm = WarmUp(sc, num_workers or task_slots(sc))
    _STARTED[_app_key(sc)] = warm
    return warm


#: The warm-up started for each Spark application (by its id), so that tfnet starts one at most.
_STARTED: dict[str, WarmUp] = {}


def _app_key(sc) -> str:
    try:
        return str(sc.applicationId)
    except Exception:  # noqa: BLE001 - a stopped context has none
        return ""


def ensure_warm_up(spark) -> WarmUp | None:
    """Starts :func:`warm_up_workers` for ``spark``'s application unless it ran already: tfnet does
    it as soon as it creates a session or finds one (``build_session``, ``TFDataset.from_dataframe``
    and ``from_rdd``), so the workers import TensorFlow while the driver prepares the model and the
    data. Nothing for a Spark Connect session (its server gives each job fresh Python workers), or
    when the cluster has no task slot yet. Never raises: ``optimize()`` checks the workers itself."""
    try:
        from optim.spark.connect import is_connect

        if spark is None or is_connect(spark):
            return None
        sc = spark.sparkContext if hasattr(spark, "sparkContext") else spark
        key = _app_key(sc)
        if not key or key in _STARTED:
            return _STARTED.get(key)
        slots = task_slots(sc)
        if slots < 1:
            return None
        return warm_up_workers(sc, slots)
    except Exception:  # noqa: BLE001 - warming up is an optimisation only
        return None


def bounded_job(sc, description: str, action, timeout_s: float):
    """Runs the Spark action ``action()`` (a ``collect``) in a job group of its own (``sc`` a
    SparkContext), or under a tag of its own (``sc`` a Spark Connect session); cancels it and
    raises DistributedTrainingError when it takes longer than ``timeout_s`` seconds."""
    from optim.spark.connect import is_connect

    group = f"tfnet-{uuid.uuid4().hex[:8]}"
    connect = is_connect(sc)
    results: list = []
    error: list = []

    def run():
        try:
            if connect:
                sc.addTag(group)
            else:
                sc.setJobGroup(group, f"tfnet: {description}", interruptOnCancel=True)
            results.append(action())
        except Exception as exc:  # noqa: BLE001 - raised in the caller's thread
            error.append(exc)
        finally:
            if connect:
                sc.removeTag(group)

    thread = threading.Thread(target=run, name="tfnet-job", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        if connect:
            sc.interruptTag(group)
        else:
            sc.cancelJobGroup(group)
        thread.join(10)
        raise DistributedTrainingError(f"Spark did not finish {description} within {timeout_s:.0f} s; cancelled.")
    if error:
        raise error[0]
    return results[0]


def check_model_dir(model_dir: str, storage_options=None) -> str:
    """Writes a small marker file into ``model_dir`` from the driver and returns its path, so that
    a full, read-only or unreachable ``model_dir`` (a wrong bucket, no credentials) fails before the
    stage starts; :func:`probe_workers` then checks that the workers see the marker.

    Raises:
        StorageError: the driver cannot write to ``model_dir`` (the message names it).
    """
    import secrets

    from optim.errors import StorageError
    from tfnet import storage

    path = storage.join(model_dir, f".tfnet-probe-{secrets.token_hex(6)}")
    try:
        storage.makedirs(model_dir, storage_options)
        storage.write_bytes_atomic(path, b"tfnet", storage_options)
    except (OSError, ImportError, ValueError) as exc:
        raise StorageError(
            f"model_dir {model_dir!r} cannot be written ({type(exc).__name__}: {exc}). Check the path or bucket, "
            "the credentials (the environment or an instance profile) and the permissions."
        ) from exc
    except Exception as exc:  # noqa: BLE001 - a file system library's own error (botocore, ...)
        raise StorageError(f"model_dir {model_dir!r} cannot be written ({type(exc).__name__}: {exc}).") from exc
    return path


def probe_workers(sc, n: int, timeout_s: float, probe: tuple | None = None) -> None:
    """Runs one small task per slot that imports what the ranks need (and reads ``probe``, the
    driver's marker in ``model_dir``, when given); turns failures into clear errors. Also warms the
    Python workers (TensorFlow gets imported once). ``sc``: a SparkContext, or a Spark Connect
    session (the tasks then run as ``mapInArrow`` over ``range(n)``)."""
    from optim.spark.connect import is_connect

    if is_connect(sc):
        job = _connect_probe(sc, n, _import_report_fn(probe))
    else:
        job = sc.parallelize(range(n), n).mapPartitions(_import_report_fn(probe))
    try:
        results = bounded_job(sc, "checking the workers' Python", job.collect, timeout_s)
    except DistributedTrainingError:
        raise DistributedTrainingError(f"The Spark workers did not answer within {timeout_s:.0f} s.") from None
    except Exception as exc:  # noqa: BLE001 - a Py4J error, turned into tfnet's
        raise stage_error(exc, [], prefix="Checking the Spark workers failed") from exc
    for report in results:
        if not isinstance(report, dict):  # a Row of JSON, from the Connect probe
            import json

            report = json.loads(report["report"])
        bad = {k: v for k, v in report.items() if k not in ("python", "host")}
        if bad:
            module, why = next(iter(bad.items()))
            if module in ("tfnet", "optim"):
                raise SparkSetupError(
                    f"The Spark workers' Python ({report['python']}) cannot import {module}: {why}. Install "
                    "tfnet there (pip install tfnet, or the same .venv) or point PYSPARK_PYTHON at a Python "
                    "that has it."
                )
            if module == "model_dir":
                from optim.errors import StorageError

                raise StorageError(
                    f"The Spark workers on {report['host']} cannot read model_dir: {why}. On a cluster, model_dir "
                    "must be storage every host reaches: a URI (s3://bucket/run, hdfs://..., with tfnet[s3] and so "
                    "on installed on the workers) or a mount every host shares."
                )
            if module.startswith("horovod"):
                raise SparkSetupError(
                    f"Horovod is not usable in the Spark workers' Python ({report['python']}): {why}. Build it "
                    "there with scripts/build_horovod.sh."
                )
            raise SparkSetupError(f"The Spark workers' Python ({report['python']}) cannot import {module}: {why}.")


def _connect_probe(spark, n: int, report_fn):
    """The probe as a DataFrame of one JSON report per task (Connect has no RDDs)."""

    def fn(batches):
        import json

        import pyarrow as pa

        for report in report_fn(batches):
            yield pa.RecordBatch.from_pydict({"report": [json.dumps(report)]})

    return spark.range(n, numPartitions=n).mapInArrow(fn, "report string")
