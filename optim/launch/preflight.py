"""Checks before the training stage starts. Driver side (or a Spark Connect client).

Horovod on the driver, ``model_dir`` writable, and one small probe task per rank that imports what the
ranks need, reads the driver's marker in ``model_dir`` and reports what failed, as clear errors. Task
slots live in :mod:`~optim.spark.slots`, the background warm-up in
:mod:`~optim.spark.warm_up` (both re-exported here).
"""

from __future__ import annotations

import json

from optim.errors import DistributedTrainingError, SparkSetupError, StorageError
from optim.launch.retry import stage_error
from optim.spark.jobs import run_job
from optim.spark.probe import import_report_fn
from optim.spark.slots import task_slots, wait_for_slots
from optim.spark.warm_up import WarmUp, ensure_warm_up, probe_job, warm_up_workers

__all__ = ["WarmUp", "check_driver_horovod", "check_model_dir", "ensure_warm_up", "probe_workers", "task_slots",
           "wait_for_slots", "warm_up_for", "warm_up_workers"]


def check_driver_horovod() -> None:
    try:
        from horovod.runner.http.http_server import RendezvousServer  # noqa: F401

        from optim.horovod_import import import_horovod

        import_horovod()
    except ImportError as exc:
        raise SparkSetupError(
            f"Horovod is not installed in this Python ({exc}). Distributed training needs Horovod 0.28.1 "
            "built with TensorFlow and Gloo: run `bash scripts/build_horovod.sh .venv/bin/python` "
            "(make install does it)."
        ) from None


def check_model_dir(model_dir: str, storage_options=None) -> str:
    """Writes a small marker file into ``model_dir`` from the driver and returns its path, so that
    a full, read-only or unreachable ``model_dir`` (a wrong bucket, no credentials) fails before the
    stage starts; :func:`probe_workers` then checks that the workers see the marker.

    Raises:
        StorageError: the driver cannot write to ``model_dir`` (the message names it).
    """
    import secrets

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


def warm_up_for(dataset) -> WarmUp | None:
    """Starts the workers' imports of TensorFlow, Horovod and tfnet (:func:`~optim.spark.warm_up.ensure_warm_up`:
    once per Spark application or Connect session, in the background) for distributed data's application, as soon
    as an ``optimize``, ``evaluate`` or ``predict`` call has the data: the workers import while the driver checks the
    data against the net and stages it. Nothing for local data, or data that names no application. Never raises."""
    if not dataset.distributed:
        return None
    return ensure_warm_up(dataset.spark_app())


def probe_workers(spark, n: int, timeout_s: float, probe: tuple | None = None) -> None:
    """Runs one small task per rank that imports what the ranks need (and reads ``probe``, the
    driver's marker in ``model_dir``, when given); turns failures into clear errors. Also warms the
    Python workers (TensorFlow gets imported once). ``spark``: a SparkSession of either kind, or a
    SparkContext."""
    try:
        results = run_job(spark, "checking the workers' Python", probe_job(spark, n, import_report_fn(probe)),
                          kind="probe", timeout_s=timeout_s)
    except DistributedTrainingError:
        raise DistributedTrainingError(f"The Spark workers did not answer within {timeout_s:.0f} s.") from None
    except Exception as exc:  # noqa: BLE001 - a Py4J or Connect error, turned into tfnet's
        raise stage_error(exc, [], prefix="Checking the Spark workers failed") from exc
    for report in results:
        if not isinstance(report, dict):  # a Row of JSON, from a DataFrame probe
            report = json.loads(report["report"])
        _raise_for(report)


def _raise_for(report: dict) -> None:
    bad = {k: v for k, v in report.items() if k not in ("python", "host")}
    if not bad:
        return
    module, why = next(iter(bad.items()))
    if module in ("tfnet", "optim"):
        raise SparkSetupError(
            f"The Spark workers' Python ({report['python']}) cannot import {module}: {why}. Install "
            "tfnet there (pip install tfnet, or the same .venv) or point PYSPARK_PYTHON at a Python "
            "that has it."
        )
    if module == "model_dir":
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
