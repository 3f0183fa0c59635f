"""TFOptimizer: fine-tunes a TFNet with an optimisation method, a loss and metrics.

Runs on the driver. ``optimize`` trains in this process for local data; for distributed data
(``TFDataset.from_dataframe`` / ``from_rdd``, or ``num_workers``), it runs the same training loop
on every task of one Spark barrier stage (``optim.spark.driver.launcher``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence

import numpy as np

from optim import losses as L
from optim import metrics as M
from optim.training.checkpoint import new_run_id, resolve_resume
from optim.training.datasets import as_dataset
from optim.training.loop import TrainConfig, evaluate, metrics_copy, train
from optim.training.reporting import MultiReporter, ProgressBar, StepRecorder, TensorBoardWriter, tensorboard_dir
from optim.transforms import assign_groups, partition
from tfnet import TFNet
from tfnet.errors import TFNetError
from tfnet.precision import check_precision

__all__ = ["TFOptimizer"]

log = logging.getLogger("tfnet.optimizer")


class TFOptimizer:
    """Fine-tunes ``net`` in place.

    Args:
        net: The TFNet to train.
        loss: A loss name (``"sparse_categorical_crossentropy"``, ``"mse"``, ...), an
            ``optim.losses.Loss``, or any callable ``(y_true, y_pred) -> scalar``.
        optim_method: An ``optim`` method (``optim.SGD(...)``), any ``init`` / ``update``
            transformation, or a dict from a weight-name prefix or compiled regex to a method (as
            Analytics Zoo's ``optim_method`` dict). With a dict, only weights in a group train.
        metrics: Metric names, ``optim.metrics.Metric`` objects or callables. Default: none.
        model_dir: Where checkpoints (``checkpoints/<run id>/``) and TensorBoard events
            (``tensorboard/<run id>/``) go; every ``optimize()`` call is a run with an id of its
            own, so runs sharing a ``model_dir`` never load or prune each other's files. Default:
            neither is written.
    """

    def __init__(self, net: TFNet, loss, optim_method, metrics: Sequence | None = None, model_dir: str | None = None):
        if not isinstance(net, TFNet):
            raise TypeError(f"TFOptimizer trains a tfnet.TFNet. Received: {type(net).__name__}")
        self.net = net
        self.loss = L.get(loss)
        self.metrics = [M.get(m) for m in (metrics or [])]
        self.model_dir = os.fspath(model_dir) if model_dir is not None else None
        self._lr_source = None
        self.method = self._method(optim_method)
        if self._lr_source is None and hasattr(self.method, "learning_rate_at"):
            self._lr_source = self.method
        # Like a Keras optimiser, the state (moments, step count for schedules) carries over
        # from one optimize() call to the next, local or distributed: this object owns it, the
        # loop takes it in and hands the new one back.
        #: The optimiser state's leaves (numpy arrays) after the last optimize(); None before.
        self.state: list[np.ndarray] | None = None
        self.global_step = 0
        #: What the last optimize() call measured: step times, startup, attempts (distributed).
        self.last_run: dict = {}

    def _method(self, optim_method):
        if isinstance(optim_method, Mapping):
            if not optim_method:
                raise ValueError("The `optim_method` dict is empty; map at least one weight-name prefix to a method.")
            groups = assign_groups(list(optim_method), self.net.weight_names)
            stats = set(self.net.statistic_names)
            chosen = [n for n, g in groups.items()
                      if g is not None and list(optim_method.values())[g] is not None and n not in stats]
            if not chosen:
                raise ValueError(
                    f"No weight matches the `optim_method` keys {list(optim_method)}. Weights: {self.net.weight_names[:10]}"
                )
            self.net.trainable = chosen
            # the logged learning rate: the first group's method that has one
            self._lr_source = next((m for m in optim_method.values() if hasattr(m, "learning_rate_at")), None)
            return partition(optim_method)
        if isinstance(optim_method, (int, float)) and not isinstance(optim_method, bool):
            from optim.methods import SGD

            return SGD(optim_method)
        if not (hasattr(optim_method, "init") and hasattr(optim_method, "update")):
            raise TypeError(
                "`optim_method` must be an optim method (e.g. optim.SGD(0.01)), a transformation with "
                f"init/update, or a dict of them. Received: {optim_method!r}"
            )
        return optim_method

    @classmethod
    def from_loss(cls, net: TFNet, loss, optim_method, metrics=None, model_dir=None) -> TFOptimizer:
        """The Analytics Zoo name for the constructor."""
        return cls(net, loss, optim_method, metrics=metrics, model_dir=model_dir)

    @classmethod
    def from_keras(cls, keras_model, model_dir: str | None = None) -> TFOptimizer:
        """Takes a compiled Keras model: freezes it into a TFNet and maps its optimiser, loss and
        metrics to tfnet's. Trainable weights are the model's trainable variables."""
        from optim.keras_compat import from_compiled_keras

        net, loss, method, metrics = from_compiled_keras(keras_model)
        return cls(net, loss, method, metrics=metrics, model_dir=model_dir)

    # ------------------------------------------------------------------ training

    def optimize(
        self,
        data,
        epochs: int = 1,
        batch_size: int = 32,
        validation_data=None,
        resume: bool | str = False,
        *,
        shuffle: bool = True,
        seed: int = 0,
        validate_every: int | None = None,
        checkpoint_every: int | None = None,
        keep_checkpoints: int = 3,
        on_nonfinite: str = "raise",
        verbose: int = 1,
        num_workers: int | None = None,
        precision: str = "fp32",
        **distributed_options,
    ) -> dict[str, list]:
        """Trains and returns the history: per-epoch lists of ``loss``, each metric, and their
        ``val_`` versions.

        Args:
            data: A tuple of numpy arrays ``(features, labels)``, a batched ``tf.data.Dataset`` of
                ``(features, labels)``, or a ``TFDataset``. Distributed data trains on Spark.
            epochs: Default 1.
            batch_size: Examples per step (the global batch when distributed). Default 32.
                Ignored for a ``tf.data.Dataset``, which is batched already.
            validation_data: Same forms as ``data``; evaluated at every epoch end (and every
                ``validate_every`` steps). Default: none.
            resume: ``True`` continues the newest run in ``model_dir`` from its newest valid
                checkpoint; a run id (``last_run["run_id"]`` of an earlier call) continues that run;
                a checkpoint path continues from that file. ``epochs`` counts from the start of the
                resumed run: a run checkpointed after epoch 1 and resumed with ``epochs=3`` trains
                2 more. Default False. ``last_run["resumed_from"]`` names the checkpoint used.
            shuffle: Shuffle numpy data each epoch, with ``seed``. Default True.
            seed: The same seed gives the same weights, bit for bit. Default 0.
            validate_every: Also validate every N steps. Default: at epoch ends only.
            checkpoint_every: Also checkpoint every N steps. Default: at epoch ends only.
            keep_checkpoints: How many checkpoints to keep. Default 3.
            on_nonfinite: ``"raise"`` (default) stops with NonFiniteLossError at a NaN or infinite
                loss or gradient, weights left at their last good state; ``"skip"`` skips the step.
            verbose: 0 quiet, 1 progress bar, 2 one line per epoch. Default 1.
            num_workers: Ranks for distributed training. Default: Spark's default parallelism
                when the data is distributed.
            precision: ``"fp32"`` (default) or ``"bf16"``: forward and backward in bfloat16 with
                float32 weights, optimiser state and loss, on every rank (``tfnet.precision``).
                On a CPU without native bfloat16: a ``PrecisionWarning`` and fp32.
        """
        config = TrainConfig(
            epochs=epochs, batch_size=batch_size, shuffle=shuffle, seed=seed, validate_every=validate_every,
            checkpoint_every=checkpoint_every, keep_checkpoints=keep_checkpoints, model_dir=self.model_dir,
            resume=resume, on_nonfinite=on_nonfinite, run_id=new_run_id(), precision=check_precision(precision),
        )
        config.check()
        config.resume = self._resume_source(config)
        dataset = as_dataset(data, batch_size)
        val = as_dataset(validation_data, batch_size) if validation_data is not None else None
        if getattr(dataset, "distributed", False) or num_workers is not None:
            from optim.spark.driver.launcher import optimize_distributed

            result = optimize_distributed(self, dataset, config, val, num_workers=num_workers, verbose=verbose,
                                          **distributed_options)
            self.net.set_weights(result.weights)
            self.state, self.global_step = result.state, result.step
            self.last_run = {**result.run, "resumed_from": result.run.get("resumed_from")}
            return result.history
        if distributed_options:
            raise TypeError(f"Unknown arguments {sorted(distributed_options)} for local training.")
        recorder = StepRecorder()
        reporter = MultiReporter([self._reporter(verbose, config.run_id), recorder])
        outcome = train(self.net, self.loss, self.method, self.metrics, dataset, config, reporter=reporter,
                        validation_data=val, initial_state=self.state, start_step=self.global_step,
                        lr_source=self._lr_source)
        self.state, self.global_step = outcome.state, outcome.step
        self.last_run = {
            "num_workers": 1, "attempts": 1, "failures": [], "run_id": config.run_id,
            "start_step": outcome.start_step, "resumed_from": outcome.resumed_from,
            "startup_s": (recorder.first_step_at - recorder.started) if recorder.first_step_at else None,
            "step_times": recorder.step_times, "allreduce_seconds": recorder.allreduce_seconds,
        }
        return outcome.history

    def _resume_source(self, config: TrainConfig):
        """What to resume from, chosen once on the driver (a run id or a checkpoint path, or
        False), so that every retry of the stage agrees: ``resume=True`` becomes the newest run."""
        if config.resume is False or not config.model_dir:
            return config.resume
        source, why = resolve_resume(os.path.join(config.model_dir, "checkpoints"), config.resume)
        if source is not None:
            log.info("Run %s resumes %s.", config.run_id, why)
        else:
            log.warning("Run %s: %s.", config.run_id, why)
        return source if source is not None else False

    def _reporter(self, verbose: int, run_id: str | None):
        writer = TensorBoardWriter(tensorboard_dir(self.model_dir, run_id)) if self.model_dir else None
        return MultiReporter([ProgressBar(verbose) if verbose else None, writer])

    def evaluate(self, data, batch_size: int = 32) -> dict[str, float]:
        """Loss and metrics over ``data`` (same forms as ``optimize``)."""
        dataset = as_dataset(data, batch_size)
        return evaluate(self.net, self.loss, metrics_copy(self.metrics), dataset, batch_size)

    def predict(self, data, batch_size: int = 32):
        """The net's outputs for ``data``: features as arrays (one, or a list), a tuple
        ``(features, labels)`` (labels ignored), a ``tf.data.Dataset`` or a ``TFDataset``."""
        dataset = as_dataset(data, batch_size, need_labels=False)
        chunks = []
        for features, _ in dataset.batches(batch_size, shuffle=False):
            out = self.net.forward(features)
            chunks.append(out if isinstance(out, list) else [out])
        if not chunks:
            raise TFNetError("predict() received no data.")
        outs = [np.concatenate([c[i] for c in chunks]) for i in range(len(chunks[0]))]
        return outs[0] if len(outs) == 1 else outs
