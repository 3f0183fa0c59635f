"""What the workers' probe runs in a Spark Python worker: it imports what the ranks need and says
what failed. Worker side.

The functions are made by factories, not defined at module level, so that cloudpickle ships them by
value: a worker whose Python lacks tfnet must still run them and say so, not fail to unpickle them.
Every probe reads its whole input first: a Python worker that leaves input unread is not reused (it
exits, and the next job, the training stage among them, waits for a fresh one to import TensorFlow).
"""

from __future__ import annotations

__all__ = ["import_report_fn", "arrow_report_fn", "REPORT_SCHEMA"]

#: The probe's rows in a DataFrame job (Spark Connect has no RDDs): one JSON report per task.
REPORT_SCHEMA = "report string"


def import_report_fn(probe: tuple | None = None):
    """``fn(rows) -> [report]``: imports TensorFlow (quietly), tfnet, optim and Horovod and reports
    ``{"python": executable, "host": name, module: error, ...}``; given ``probe = (path,
    storage_options)``, also whether the worker can read that file (the driver's marker in
    ``model_dir``)."""

    def import_report(rows) -> list[dict]:
        import socket
        import sys

        for _ in rows:  # the whole input (see the module's notes)
            pass
        report = {"python": sys.executable, "host": socket.gethostname()}
        try:  # TensorFlow first, with its start-up banner kept out of the executor's stderr
            from optim.logs import import_tensorflow

            import_tensorflow()
        except Exception:  # noqa: BLE001 - the loop below reports what cannot be imported
            pass
        for module in ("tfnet", "optim", "tensorflow", "horovod.tensorflow"):
            try:
                if module == "horovod.tensorflow":  # as the ranks import it: Keras left unloaded
                    from optim.horovod_import import import_horovod

                    if not import_horovod().gloo_built():
                        report[module] = "built without Gloo"
                else:
                    __import__(module)
            except Exception as exc:  # noqa: BLE001 - reported back to the driver
                report[module] = f"{type(exc).__name__}: {exc}"
        if probe is not None and "tfnet" not in report:
            try:
                from tfnet import storage

                if not storage.exists(probe[0], probe[1]):
                    report["model_dir"] = f"{probe[0]} is not there (not the driver's storage)"
            except Exception as exc:  # noqa: BLE001 - reported back to the driver
                report["model_dir"] = f"{type(exc).__name__}: {exc}"
        return [report]

    return import_report


def arrow_report_fn(report_fn):
    """``report_fn`` for ``mapInArrow``: one Arrow batch of :data:`REPORT_SCHEMA` per report."""

    def reports(batches):
        import json

        import pyarrow as pa

        for report in report_fn(batches):
            yield pa.RecordBatch.from_pydict({"report": [json.dumps(report)]})

    return reports
