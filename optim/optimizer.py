"""TFOptimizer: fine-tunes a TFNet with an optimisation method, a loss and metrics.

Runs on the driver. ``optimize`` trains in this process for local data; for distributed data
(``TFDataset.from_dataframe`` / ``from_rdd``, or ``num_workers``), it runs the same training loop
on every task of one Spark barrier stage (``optim.launch.launcher``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence

import numpy as np

from optim import losses as L
from optim import output_metrics as OM
from optim.callbacks import Callback, run_info
from optim.config import TrainConfig, check_callbacks
from optim.data import as_dataset, in_input_order, in_output_order, resolve_batch_size
from optim.data.holdout import HoldOut, check_split
from optim.data.names import weights_in_output_order
from optim.logs import console_error
from optim.protocol import NetOutputs, RunResult, RunSummary, TrainSpec
from optim.sync import EveryStep, check_sync
from optim.training.callbacks import callback_list, shippable_callbacks
from optim.training.checkpoint import new_run_id, resolve_resume
from optim.training.checks import warn_if_logits_to_probability_loss
from optim.training.evaluation import evaluate, metrics_copy
from optim.training.history import History
from optim.training.interrupts import Interruptible
from optim.training.keras_callbacks import plan_keras_callbacks
from optim.training.reporting import (
    MultiReporter,
    ProgressBar,
    Reporter,
    StepRecorder,
    TensorBoardWriter,
    check_verbose,
)
from optim.training.spec import train
from optim.transforms import assign_groups, partition
from tfnet import TFNet, storage
from tfnet.errors import TFNetError
from tfnet.precision import check_precision

__all__ = ["TFOptimizer"]


def _weighted(metric):
    import copy

    metric = copy.copy(metric)
    metric.weighted = True
    return metric

log = logging.getLogger("tfnet.optimizer")


class TFOptimizer:
    """Fine-tunes ``net`` in place.

    Args:
        net: The TFNet to train.
        loss: A loss name (``"sparse_categorical_crossentropy"``, ``"mse"``, ...), an
            ``optim.losses.Loss``, or any callable ``(y_true, y_pred) -> scalar``. For a net with
            several outputs: a list (one per output) or a dict by output name, or one loss that
            applies to each output, as in Keras; labels are then a list in output order, and the
            metrics follow the first output.
        optim_method: An ``optim`` method (``optim.SGD(...)``), any ``init`` / ``update``
            transformation, or a dict from a weight-name prefix or compiled regex to a method (as
            Analytics Zoo's ``optim_method`` dict). With a dict, only weights in a group train.
        metrics: Metric names, ``optim.metrics.Metric`` objects or callables, for the first output; or, for a net
            of several outputs, a dict by output name of each output's (reported as ``{output}_{metric}``, as
            Keras's ``compile`` reports them). A net with a loss on more than one output also reports each
            output's own loss (``{output}_loss``, without its ``loss_weights`` weight), as Keras does. Default:
            none.
        model_dir: Where checkpoints (``checkpoints/<run id>/``) and TensorBoard events
            (``tensorboard/<run id>/``) go; every ``optimize()`` call is a run with an id of its
            own, so runs sharing a ``model_dir`` never load or prune each other's files. Default:
            neither is written. A local path or a URI fsspec understands (``s3://bucket/run``,
            ``gs://``, ``abfs://``, ``hdfs://``; ``pip install tfnet[s3]`` and so on): on a
            cluster without a shared disk, that is where the ranks meet.
        storage_options: fsspec's options for a URI ``model_dir`` (an endpoint, a profile);
            credentials are best left to the environment or an instance profile. Default: none.
        loss_weights: For several outputs: a weight per output (a list, or a dict by output name);
            the loss is their weighted sum. Default: 1.0 each.
        weighted_metrics: Metrics weighted by the data's sample weights (the same forms); those in ``metrics``
            are not, as in Keras's ``compile``. Default: none.
    """

    def __init__(self, net: TFNet, loss, optim_method, metrics: Sequence | Mapping | None = None,
                 model_dir: str | None = None, storage_options: Mapping | None = None, loss_weights=None,
                 weighted_metrics: Sequence | Mapping | None = None):
        if not isinstance(net, TFNet):
            raise TypeError(f"TFOptimizer trains a tfnet.TFNet. Received: {type(net).__name__}")
        self.net = net
        outputs = list(net.output_names)
        self.loss = L.for_outputs(loss, outputs, loss_weights)
        warn_if_logits_to_probability_loss(loss, net)
        self.metrics = (OM.for_outputs(metrics, outputs) + [_weighted(m) for m in OM.for_outputs(weighted_metrics, outputs)]
                        + OM.loss_trackers(self.loss, outputs))
        for m in self.metrics:  # a Keras metric built from its output's shape (F1Score): built here, before any batch
            if getattr(m, "pending", False):
                m.bind_shape(net.output_specs[m.output_index or 0].shape)
        self.model_dir = os.fspath(model_dir) if model_dir is not None else None
        self.storage_options = dict(storage_options) if storage_options else None
        #: What gives the logged learning rate (a method with ``learning_rate_at``), or None.
        self.lr_source = None
        self.method = self._method(optim_method)
        if self.lr_source is None and hasattr(self.method, "learning_rate_at"):
            self.lr_source = self.method
        # Like a Keras optimiser, the state (moments, step count for schedules) carries over
        # from one optimize() call to the next, local or distributed: this object owns it, the
        # loop takes it in and hands the new one back.
        #: The optimiser state's leaves (numpy arrays) after the last optimize(); None before.
        self.state: list[np.ndarray] | None = None
        #: The server method's state (``optim.LocalSGD``) after the last optimize(), carried over the
        #: same way; empty for the other sync modes.
        self.exchange_state: list[np.ndarray] = []
        self.global_step = 0
        #: What the last optimize() call measured: step times, startup, attempts (distributed).
        self.last_run: dict = {}

    def _method(self, optim_method):
        if isinstance(optim_method, Mapping):
            if not optim_method:
                raise ValueError("The `optim_method` dict is empty; map at least one weight-name prefix to a method.")
            if any(getattr(m, "use_ema", False) for m in optim_method.values()):
                raise ValueError("`use_ema` keeps a moving average of every weight the method trains: give one "
                                 "method for all weights, not a dict of them.")
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
            self.lr_source = next((m for m in optim_method.values() if hasattr(m, "learning_rate_at")), None)
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
    def from_keras(cls, keras_model, model_dir: str | None = None, *, input_signature=None) -> TFOptimizer:
        """Takes a compiled Keras model: freezes it into a TFNet and maps its optimiser, loss and
        metrics to tfnet's. Trainable weights are the model's trainable variables. ``input_signature``:
        a subclassed model's inputs, as :meth:`TFNet.from_keras` takes them."""
        from optim.keras_compat import from_compiled_keras

        net, loss, method, metrics, loss_weights, weighted = from_compiled_keras(keras_model, input_signature)
        return cls(net, loss, method, metrics=metrics, model_dir=model_dir, loss_weights=loss_weights,
                   weighted_metrics=weighted)

    # ------------------------------------------------------------------ training

    def optimize(
        self,
        data,
        epochs: int | None = None,
        batch_size: int | None = None,
        validation_data=None,
        resume: bool | str = False,
        *,
        sample_weight=None,
        max_steps: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        validate_every: int | None = None,
        checkpoint_every: int | None = None,
        keep_checkpoints: int = 3,
        on_nonfinite: str = "raise",
        verbose: int | str = "auto",
        num_workers: int | None = None,
        precision: str = "fp32",
        sync=None,
        callbacks=None,
        class_weight: dict | None = None,
        validation_split: float | None = None,
        **distributed_options,
    ) -> History:
        """Trains and returns the history: per-epoch lists of ``loss``, each metric, and their
        ``val_`` versions, as a Keras ``History`` (``history.history["loss"]``, ``history.epoch``) that
        is also a dict (``history["loss"]``).

        Ctrl-C stops the run (a distributed run's stage is cancelled and its ranks end first) and
        raises ``KeyboardInterrupt`` from this call, with a short traceback; a second Ctrl-C while it
        stops is ignored.

        Args:
            data: A tuple of numpy arrays ``(features, labels)``, a batched ``tf.data.Dataset`` of
                ``(features, labels)``, or a ``TFDataset``. Distributed data trains on Spark.
            epochs: Default 1, or as many as ``max_steps`` needs when that is given.
            batch_size: Examples per step (the global batch when distributed). Default: the batch
                size the ``TFDataset`` was made with, else 32; giving both, different, is an error.
                Ignored for a ``tf.data.Dataset``, which is batched already.
            sample_weight: One weight per example of numpy ``data`` (or give ``(x, y, w)``, a
                ``tf.data.Dataset`` of ``(x, y, w)``, or a DataFrame's column with
                ``TFDataset.from_dataframe(..., weight_col=...)``): losses and ``weighted_metrics``
                weight examples as Keras's do. Default: none.
            max_steps: Stop when the global step reaches this (Analytics Zoo's ``MaxIteration``; it
                counts the steps of a resumed run too, as TensorFlow Estimator's ``max_steps``).
                A stop in the middle of an epoch writes a checkpoint there. Default: none.
            validation_data: Same forms as ``data``; evaluated at every epoch end (and every
                ``validate_every`` steps). Default: none.
            validation_split: A fraction of the training rows held out for validation, as Keras's: the rows a
                hash of their values (keyed by ``seed``) picks, so the same rows on every attempt and every data
                road (numpy arrays, a DataFrame, an RDD, Parquet or Delta files; not a ``tf.data`` input);
                a distributed run's ranks hold out their own rows as they read them. ``validation_data`` wins
                when both are given. Default: none.
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
            verbose: As Keras's ``fit``: 0 quiet, 1 a progress bar (in a terminal or a notebook; one
                line per epoch without one, as in a log file), 2 one line per epoch, ``"auto"`` (the
                default) as 1.
            num_workers: Ranks for distributed training. Default: Spark's default parallelism
                when the data is distributed.
            precision: ``"fp32"`` (default) or ``"bf16"``: forward and backward in bfloat16 with
                float32 weights, optimiser state and loss, on every rank (``tfnet.precision``).
                On a CPU without native bfloat16: a ``PrecisionWarning`` and fp32.
            sync: How often the ranks exchange (:mod:`optim.sync`): ``None`` averages the gradients
                every step (bucketed as the backward pass makes them); ``optim.EveryStep(...)`` sets
                its buckets and 16-bit compression; ``optim.LocalSGD(every=K, server=method)``
                averages the weights' moves every K local steps through a server method;
                ``optim.Asynchronous(staleness=1)`` exchanges each step's gradients in the
                background and applies them a step later. Default: None.
            callbacks: Keras callbacks (``keras.callbacks.EarlyStopping``, ``ReduceLROnPlateau``,
                ``TerminateOnNaN``, ``LambdaCallback``, your own subclass), called as ``model.fit``
                calls them: in this process for local data, on rank 0 of a distributed run (so they must
                pickle, and what they keep stays there), their decisions taken by every rank at the same
                step (:mod:`optim.training.callbacks`). Default: none.
            class_weight: ``{class id: weight}``: each training example's loss weighs its class's weight
                (1.0 for a class left out), times its sample weight when it has one, as Keras's
                ``class_weight``; one output only. Default: none.
            **distributed_options: For distributed data: ``min_workers`` and ``elastic_wait``
                (elastic training: go on with fewer ranks when executors are lost, grow back when
                they return), ``max_retries``, ``timeout``, ``startup_timeout``, ``slot_wait`` and
                ``steps_per_epoch``; see :func:`optim.launch.launcher.optimize_distributed`.
        """
        verbose = check_verbose(verbose)
        with Interruptible():
            try:
                dataset, val, batch_size = self._inputs(data, batch_size, validation_data, sample_weight, on_nonfinite,
                                                        validation_split, seed)
                callbacks = callback_list(callbacks)
                ours = [c for c in callbacks if isinstance(c, Callback)]  # run here, not in the loop
                keras = plan_keras_callbacks([c for c in callbacks if not isinstance(c, Callback)], self.net,
                                             self.model_dir, self.method)
                config = self._config(epochs=epochs, batch_size=batch_size, shuffle=shuffle, seed=seed,
                                      validate_every=validate_every,
                                      checkpoint_every=checkpoint_every or keras.checkpoint_every,
                                      keep_checkpoints=keep_checkpoints, resume=resume or keras.resume,
                                      on_nonfinite=on_nonfinite, max_steps=max_steps, precision=precision, sync=sync,
                                      class_weight=class_weight, callbacks=keras.run, model_dir=keras.model_dir,
                                      tensorboard_dir=keras.tensorboard_dir, swap_ema=keras.swap_ema)
                distributed = dataset.distributed or num_workers is not None
                if not distributed and distributed_options:
                    raise TypeError(f"Unknown arguments {sorted(distributed_options)} for local training.")
                if distributed:
                    shippable_callbacks(config.callbacks)
                history = self._run_with(ours, run_info(self, dataset, config, num_workers, distributed_options),
                                         lambda reporters: self._train_distributed(
                                             dataset, config, val, num_workers, verbose, distributed_options, reporters)
                                         if distributed else self._train_locally(dataset, config, val, verbose,
                                                                                 reporters))
            except KeyboardInterrupt:  # Ctrl-C: the run stopped (a Spark stage: cancelled, its ranks gone)
                raise KeyboardInterrupt from None
        return History(history, {"epochs": epochs, "verbose": verbose})

    def _config(self, epochs: int | None, max_steps: int | None, precision: str, sync, callbacks=None,
                model_dir: str | None = None, **settings) -> TrainConfig:
        """This call's TrainConfig (a new run id), checked, with what it resumes from chosen once here."""
        if epochs is None:
            epochs = 1 if max_steps is None else 1 << 30  # bounded by max_steps
        sync = check_sync(sync)
        if not isinstance(sync, EveryStep) and getattr(self.method, "use_ema", False):
            raise ValueError(f"`use_ema` keeps one moving average of the weights, which every rank must agree on: "
                             f"train with sync=None (every step), not {type(sync).__name__}.")
        config = TrainConfig(epochs=epochs, max_steps=max_steps, precision=check_precision(precision),
                             sync=sync, model_dir=model_dir or self.model_dir,
                             storage_options=self.storage_options,
                             run_id=new_run_id(), callbacks=check_callbacks(callbacks), **settings)
        config.check()
        config.resume = self._resume_source(config)
        return config

    def _inputs(self, data, batch_size, validation_data, sample_weight, on_nonfinite: str, validation_split=None,
                seed: int = 0):
        """``(training data, validation data, batch size)`` as TFDatasets, checked on the driver; with
        ``validation_split`` (and no ``validation_data``, which wins, as in Keras) the rows a seeded hash holds out
        (:mod:`optim.data.holdout`)."""
        if sample_weight is not None:
            if not (isinstance(data, tuple) and len(data) == 2):
                raise TypeError("`sample_weight` goes with numpy data given as (features, labels); for a tf.data.Dataset, "
                                "put the weights in the data (a third element); for a DataFrame, name its column: "
                                "TFDataset.from_dataframe(..., weight_col=...).")
            data = (*data, sample_weight)
        dataset = self._dataset(data, batch_size)
        batch_size = resolve_batch_size(dataset, batch_size)
        val = self._dataset(validation_data, batch_size) if validation_data is not None else None
        fraction = check_split(validation_split)
        if fraction is not None and val is None:
            dataset, val = dataset.hold_out(HoldOut(fraction, seed))
        dataset = self._checked(dataset, on_nonfinite, "the training data")
        val = self._checked(val, on_nonfinite, "the validation data", training=False)
        return dataset, val, batch_size

    def _run_with(self, callbacks: list, info, train) -> dict[str, list]:
        """Runs ``train(reporters)`` with tfnet's own callbacks told of the start, of each epoch's logs as they
        reach this process (through ``reporters``) and of the end; what they return joins ``last_run``."""
        if not callbacks:
            return train([])
        for cb in callbacks:
            cb.on_run_begin(info)
        try:
            history = train([_EpochsTo(callbacks)])
        except BaseException as exc:
            for cb in callbacks:
                cb.on_run_end(info, {}, dict(self.last_run), error=exc)
            raise
        for cb in callbacks:
            self.last_run.update(cb.on_run_end(info, history, dict(self.last_run)) or {})
        return history

    def _train_distributed(self, dataset, config: TrainConfig, val, num_workers: int | None, verbose: int,
                           options: dict, reporters=()) -> dict[str, list]:
        """Over Spark (:func:`optim.launch.launcher.optimize_distributed`); keeps what rank 0 returned."""
        from optim.launch.launcher import optimize_distributed

        try:
            result = optimize_distributed(self.train_spec(config), dataset, val, num_workers=num_workers,
                                          verbose=verbose, reporters=list(reporters), **options)
        except TFNetError as err:  # a rank's typed error: short on the console (its traces are attributes)
            raise console_error(err)  # noqa: B904 (its cause is kept as err.spark_error)
        return self._finish(result)

    def _train_locally(self, dataset, config: TrainConfig, val, verbose: int, reporters=()) -> dict[str, list]:
        """In this process, with the same loop every rank runs."""
        recorder = StepRecorder()
        reporter = MultiReporter([self._reporter(verbose, config), recorder, *reporters])
        result = train(self.net, self.train_spec(config), dataset, reporter=reporter, validation_data=val)
        result.run = RunSummary(
            num_workers=1, failures=[], run_id=config.run_id,
            startup_s=(recorder.first_step_at - recorder.started) if recorder.first_step_at else None,
            step_times=recorder.step_times, allreduce_seconds=recorder.allreduce_seconds,
            start_step=result.start_step, resumed_from=result.resumed_from).to_dict()
        return self._finish(result)

    def _finish(self, result: RunResult) -> dict[str, list]:
        """Keeps what a run, local or distributed, ended with: rank 0's weights (a distributed run), the
        optimiser and server states and the step for the next ``optimize()``, and ``last_run``."""
        if result.weights is not None:
            self.net.set_weights(result.weights)
            if self.net.state.seed_step is not None:  # the ranks' steps drew their dropout noise: the next run draws on
                self.net.state.seed_step.assign_add(max(result.step - result.start_step, 0))
        self.state, self.global_step = result.state, result.step
        self.exchange_state = list(result.exchange_state)
        self.last_run = result.last_run()
        return result.history

    def train_spec(self, config: TrainConfig) -> TrainSpec:
        """What to train and how (:class:`~optim.protocol.TrainSpec`): this optimiser's net, loss, method, metrics,
        state and step, with ``config``; the launcher ships it to the ranks (:meth:`TrainSpec.for_ranks`)."""
        return TrainSpec(net=self.net, hooks=None, loss=self.loss, method=self.method,
                         metrics=self.metrics, config=config, state=self.state, start_step=self.global_step,
                         exchange_state=self.exchange_state or None, lr_source=self.lr_source,
                         outputs=NetOutputs.of(self.net))

    def _dataset(self, data, batch_size, need_labels: bool = True):
        """``as_dataset``, with features and labels given as dicts by input and output name (as Keras's ``fit``
        takes them) put in the net's input and output order, and the
        data's columns checked against the net's inputs before any job (:meth:`~optim.data.DataAdapter.bind`)."""
        names = list(self.net.input_names)
        if isinstance(data, Mapping):
            data = in_input_order(data, names)
        elif isinstance(data, tuple) and len(data) in (2, 3):  # fit's (x, y[, w]), each dict by input or output name
            x, y = data[0], data[1]
            if len(data) == 3 and isinstance(data[2], Mapping):  # sample weights by output, as fit takes them
                data = (*data[:2], weights_in_output_order(data[2], list(self.net.output_names)))
            data = (in_input_order(x, names) if isinstance(x, Mapping) else x,
                    in_output_order(y, list(self.net.output_names)) if isinstance(y, Mapping) else y, *data[2:])
        dataset = as_dataset(data, batch_size, need_labels=need_labels)
        if dataset.distributed:  # its workers import TensorFlow while this process checks and stages the data
            from optim.launch.preflight import warm_up_for

            warm_up_for(dataset)
        dataset.bind(names, self.net.input_specs, list(self.net.output_names))
        return dataset

    def _checked(self, dataset, on_nonfinite: str, where: str, training: bool = True):
        """The data's own checks on the driver (:meth:`~optim.data.DataAdapter.checked`): numpy labels and
        NaN or Inf features here, a DataFrame's or Parquet files' label types by their schema before any
        job, ``tf.data`` input batch by batch as it is read; a partition's rows on its rank."""
        if dataset is None:
            return None
        return dataset.checked(self.loss, self.net, on_nonfinite, where, training)

    def _resume_source(self, config: TrainConfig):
        """What to resume from, chosen once on the driver (a run id or a checkpoint path, or
        False), so that every retry of the stage agrees: ``resume=True`` becomes the newest run."""
        if config.resume is False or not config.model_dir:
            return config.resume
        source, why = resolve_resume(storage.join(config.model_dir, "checkpoints"), config.resume,
                                     storage_options=config.storage_options)
        if source is not None:
            log.info("Run %s resumes %s.", config.run_id, why)
        else:
            log.warning("Run %s: %s.", config.run_id, why)
        return source if source is not None else False

    def _reporter(self, verbose: int, config: TrainConfig):
        events = config.events_dir()
        writer = TensorBoardWriter(events, self.storage_options) if events else None
        return MultiReporter([ProgressBar(verbose) if verbose else None, writer])

    def evaluate(self, data, batch_size: int | None = None, num_workers: int | None = None) -> dict[str, float]:
        """Loss and metrics over ``data`` (same forms as ``optimize``). Distributed data (a
        DataFrame, an RDD; ``from_tf_data`` with ``num_workers``) is evaluated over Spark, one task
        per partition, and the sums merged: the same result as on the collected data. Default batch
        size: the ``TFDataset``'s, else 32."""
        dataset = self._dataset(data, batch_size)
        batch_size = resolve_batch_size(dataset, batch_size)
        if dataset.distributed or num_workers is not None:
            from optim.launch.evaluate import evaluate_distributed

            with Interruptible():
                try:
                    return evaluate_distributed(self, dataset, batch_size, num_workers)
                except TFNetError as err:
                    raise console_error(err)  # noqa: B904 (its cause is kept as err.spark_error)
                except KeyboardInterrupt:  # Ctrl-C: the Spark job cancelled, its tasks gone
                    raise KeyboardInterrupt from None
        return evaluate(self.net, self.loss, metrics_copy(self.metrics), dataset, batch_size)

    def predict(self, data, batch_size: int | None = None):
        """The net's outputs for ``data``: features as arrays (one, or a list), a tuple
        ``(features, labels)`` (labels ignored), a ``tf.data.Dataset`` or a ``TFDataset``. For a
        DataFrame dataset: the DataFrame with the outputs added (``output``, or one column per
        output), lazily, rows in their order; for an RDD dataset: an RDD of outputs, aligned with
        the records (both through :class:`~optim.TFPredictor`)."""
        dataset = self._dataset(data, batch_size, need_labels=False)
        batch_size = resolve_batch_size(dataset, batch_size)
        if dataset.distributed:
            from optim.launch.evaluate import predict_distributed

            return predict_distributed(self.net, dataset, batch_size)
        chunks = []
        for features, _ in dataset.batches(batch_size, shuffle=False):
            out = self.net.forward(features)
            chunks.append(out if isinstance(out, list) else [out])
        if not chunks:
            raise TFNetError("predict() received no data.")
        outs = [np.concatenate([c[i] for c in chunks]) for i in range(len(chunks[0]))]
        return outs[0] if len(outs) == 1 else outs


class _EpochsTo(Reporter):
    """Each epoch's logs, as they reach this process, to tfnet's own callbacks."""

    def __init__(self, callbacks: list):
        self.callbacks = callbacks

    def epoch_end(self, epoch: int, step: int, logs: dict) -> None:
        for cb in self.callbacks:
            cb.on_epoch_end(epoch, dict(logs))
