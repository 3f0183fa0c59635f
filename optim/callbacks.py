"""Callbacks that run where ``optimize()`` is called (the driver, or a Spark Connect client), as opposed to
Keras callbacks, which run in the training loop (:mod:`optim.training.callbacks`). Both go in
``optimize(..., callbacks=[...])``.

A :class:`Callback` is told of the run's start (what it will do: :class:`RunInfo`), of each epoch's logs as they
reach this process (locally at once; from rank 0 over the progress channel in a classic session; polled from
``model_dir`` under Spark Connect, else all at the end), and of the run's end (its history, ``last_run``, the
fine-tuned net, or the error it failed with).

:class:`MLflowLogger` is MLflow's tracking, built in: ``pip install tfnet[mlflow]``; MLflow is imported only when
the logger is used. Tracking never fails a run: a server that is down or refuses a write gives one warning and the
training goes on.
"""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Callback", "MLflowLogger", "RunInfo"]

log = logging.getLogger("tfnet.callbacks")


@dataclass
class RunInfo:
    """What an ``optimize()`` call will do: ``params`` (the optimiser and its hyperparameters, the learning rate or
    schedule, the batch, the epochs, the ranks, the sync mode, the precision, the LoRA rank, the data source, its
    path and version and its rows), the ``net`` it trains and the training ``data`` (the TFDataset)."""

    params: dict = field(default_factory=dict)
    net: Any = None
    data: Any = None


class Callback:
    """A callback of tfnet's own, run where ``optimize()`` is called. Override what you need."""

    def on_run_begin(self, info: RunInfo) -> None:
        """Before the first step."""

    def on_epoch_end(self, epoch: int, logs: dict) -> None:
        """An epoch's logs (training and validation), as they reach this process."""

    def on_run_end(self, info: RunInfo, history: dict, last_run: dict, error: BaseException | None = None) -> dict:
        """After the run (``error``: what it failed with). Returns entries to add to ``last_run``."""
        return {}


class MLflowLogger(Callback):
    """Logs a run into MLflow: into the active run, or a new one (in ``experiment``, named ``run_name``).

    Parameters (the optimiser and its hyperparameters, batch size, epochs, ranks, sync mode, precision, LoRA rank,
    the data source, its path and version and its rows), the training data as the run's dataset input (context
    ``training``: :func:`optim.mlflow_model.dataset_input`), one metric series per training and validation metric
    with the epoch as the step, tags (tfnet's run id, the attempts, the changes of the ranks), and, with
    ``log_model``, the fine-tuned net as an MLflow model named ``model``, the run's output at the step after the
    last epoch (a pyfunc with a tensor-spec signature and an input example, :mod:`optim.mlflow_model`):
    ``mlflow.pyfunc.load_model(f"runs:/{run_id}/model").predict(x)`` gives ``net.forward(x)``.
    ``last_run["mlflow_run_id"]`` names the run: None when MLflow made none (a server that is down).

    Args:
        experiment: The experiment's name for a new run. Default: MLflow's current one.
        run_name: A new run's name. Default: MLflow's.
        tracking_uri: Where to log (``http://host:5000``, ``file:/path``). Default: MLflow's (the
            ``MLFLOW_TRACKING_URI`` variable, else ``./mlruns``).
        log_model: Log the net as the run's model. Default True.
        tags: More tags for the run. Default: none.
    """

    def __init__(self, experiment: str | None = None, run_name: str | None = None, tracking_uri: str | None = None,
                 log_model: bool = True, tags: dict | None = None):
        self.experiment, self.run_name, self.tracking_uri = experiment, run_name, tracking_uri
        self.log_model, self.tags = bool(log_model), dict(tags or {})
        self.run_id: str | None = None
        self._owned = False
        self._epochs: set[int] = set()
        self._broken = False

    # ---- the hooks

    def on_run_begin(self, info: RunInfo) -> None:
        self._epochs = set()
        self._broken = False
        self.run_id = None
        self._guard(self._begin, info)

    def on_epoch_end(self, epoch: int, logs: dict) -> None:
        if self.run_id is not None and not self._broken:
            self._guard(self._metrics, epoch, logs)

    def on_run_end(self, info: RunInfo, history: dict, last_run: dict, error: BaseException | None = None) -> dict:
        if self.run_id is not None:
            self._guard(self._end, info, history, last_run, error)
        return {"mlflow_run_id": self.run_id}

    # ---- MLflow

    def _begin(self, info: RunInfo) -> None:
        mlflow = _mlflow()
        if self.tracking_uri:
            mlflow.set_tracking_uri(self.tracking_uri)
        active = mlflow.active_run()
        if active is not None:
            self.run_id, self._owned = active.info.run_id, False
        else:
            if self.experiment:
                mlflow.set_experiment(self.experiment)
            self.run_id, self._owned = mlflow.start_run(run_name=self.run_name).info.run_id, True
        client = mlflow.tracking.MlflowClient()
        params = {k: _param(v) for k, v in info.params.items() if v is not None}
        for k, v in params.items():
            client.log_param(self.run_id, k, v)
        for k, v in {"tfnet.version": _version(), **self.tags}.items():
            client.set_tag(self.run_id, k, str(v))
        self._dataset(mlflow, info.data)

    def _dataset(self, mlflow, data) -> None:
        """The training data as the run's dataset input; data MLflow cannot describe is left out, with a log line."""
        if data is None:
            return
        try:
            from optim.mlflow_model import dataset_input

            dataset = dataset_input(data)
        except Exception as exc:  # noqa: BLE001 - a dataset MLflow cannot describe costs only its input
            log.info("MLflow: no dataset input for %s (%s: %s)", type(data).__name__, type(exc).__name__, exc)
            return
        if dataset is not None:
            with _active(mlflow, self.run_id):
                mlflow.log_input(dataset, context="training")

    def _metrics(self, epoch: int, logs: dict) -> None:
        client = _mlflow().tracking.MlflowClient()
        for k, v in logs.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                client.log_metric(self.run_id, k, float(v), step=int(epoch))
        self._epochs.add(int(epoch))

    def _end(self, info: RunInfo, history: dict, last_run: dict, error: BaseException | None) -> None:
        mlflow = _mlflow()
        client = mlflow.tracking.MlflowClient()
        epochs = max((len(v) for v in history.values() if isinstance(v, list)), default=0)
        for epoch in range(epochs):  # what no event brought here (a Connect client without model_dir)
            if epoch not in self._epochs:
                self._metrics(epoch, {k: v[epoch] for k, v in history.items() if isinstance(v, list) and epoch < len(v)})
        tags = {"tfnet.run_id": last_run.get("run_id"), "tfnet.attempts": last_run.get("attempts"),
                "tfnet.mode": last_run.get("mode", "local"), "tfnet.membership": last_run.get("membership"),
                "tfnet.resumed_from": last_run.get("resumed_from")}
        for k, v in tags.items():
            if v is not None:
                client.set_tag(self.run_id, k, str(v))
        if error is None and self.log_model and info.net is not None:
            with warnings.catch_warnings():  # MLflow asks for type hints on predict; the signature says what it takes
                warnings.filterwarnings("ignore", message=".*type hints.*", category=UserWarning)
                from optim.mlflow_model import log_net
            # the step after the last epoch: MLflow copies the run's metrics at the model's step to the model, which
            # a file store lists in the run's series a second time
            step = max(self._epochs | set(range(epochs)), default=-1) + 1
            with _active(mlflow, self.run_id):
                log_net(info.net, "model", step=step)
        if self._owned:  # once: MLflow prints its "View run" lines each time a run is terminated
            status = "FAILED" if error is not None else "FINISHED"
            if mlflow.active_run() is not None and mlflow.active_run().info.run_id == self.run_id:
                mlflow.end_run(status=status)
            else:
                client.set_terminated(self.run_id, status=status)

    def _guard(self, fn, *args) -> None:
        """Runs ``fn``; a tracking failure warns once and the run goes on without tracking."""
        if self._broken:
            return
        try:
            with _short_requests():
                fn(*args)
        except ImportError:
            raise
        except Exception as exc:  # noqa: BLE001 - tracking never fails a run
            self._broken = True
            message = (f"MLflow tracking stopped ({type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''})"
                       "; the training goes on without it.")
            log.warning(message)
            warnings.warn(message, RuntimeWarning, stacklevel=3)


def _mlflow():
    try:
        import mlflow
    except ImportError:
        raise ImportError("MLflowLogger logs to MLflow: pip install 'tfnet[mlflow]' (or mlflow).") from None
    return mlflow


class _active:
    """The run ``run_id`` as MLflow's active run for the duration (resumed if another is active or none is)."""

    def __init__(self, mlflow, run_id: str):
        self.mlflow, self.run_id, self.started = mlflow, run_id, False

    def __enter__(self):
        current = self.mlflow.active_run()
        if current is None or current.info.run_id != self.run_id:
            self.mlflow.start_run(run_id=self.run_id, nested=current is not None)
            self.started = True
        return self

    def __exit__(self, *exc):
        if self.started:  # the run goes on: no "View run" lines for it
            saved = os.environ.get("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT")
            os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
            try:
                self.mlflow.end_run(status="RUNNING")
            finally:
                if saved is None:
                    os.environ.pop("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", None)
                else:
                    os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = saved


class _short_requests:
    """MLflow's HTTP calls give up after a few seconds here (its defaults retry for minutes), unless the user set
    them: a tracking server that is down costs the run seconds, not minutes."""

    DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
                "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in self.DEFAULTS}
        for k, v in self.DEFAULTS.items():
            os.environ.setdefault(k, v)
        return self

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)


def _param(value) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text[:500]


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("tfnet")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "unknown"


def run_info(opt, dataset, config, num_workers, options: dict) -> RunInfo:
    """The :class:`RunInfo` of an ``optimize()`` call: what it will do."""
    method = opt.method
    params: dict = {"optimizer": type(method).__name__}
    get_config = getattr(method, "get_config", None)
    if callable(get_config):
        params.update({f"optimizer.{k}": v for k, v in get_config().items()})
    lora = getattr(opt.net, "adapters", {}) or {}
    rows = getattr(dataset, "num_rows", None)
    if rows is None and hasattr(dataset, "__len__"):
        try:
            rows = len(dataset)
        except TypeError:
            rows = None
    params.update({"batch_size": config.batch_size, "epochs": config.epochs, "max_steps": config.max_steps,
                   "num_workers": num_workers if num_workers is not None else (None if not dataset.distributed else
                                                                              "spark default"),
                   "min_workers": options.get("min_workers"), "sync": config.sync, "precision": config.precision,
                   "seed": config.seed, "loss": getattr(opt.loss, "name", type(opt.loss).__name__),
                   "lora_rank": next(iter(lora.values())).rank if lora else None,
                   "data": type(dataset).__name__, "data_path": _data_path(dataset),
                   "data_version": getattr(dataset, "version", None) if type(dataset).__name__ == "DeltaDataset" else None,
                   "data_rows": rows})
    return RunInfo(params, opt.net, dataset)


def _data_path(dataset) -> str | None:
    """Where Parquet or Delta data was read (a Delta table's path, a Parquet file or folder), else None."""
    path = getattr(dataset, "path", None) if type(dataset).__name__ in ("ParquetDataset", "DeltaDataset") else None
    return None if path is None else str(path)


def temp_folder() -> str:
    return tempfile.mkdtemp(prefix="tfnet-mlflow-")
