"""A compiled Keras model run by tfnet through Keras's own calls (driver side): :class:`KerasModel`'s ``fit``,
``evaluate`` and ``predict`` take the arguments ``keras.Model``'s take and give back what they give, and after
``fit`` the Keras model holds the trained weights, as after Keras's ``fit``. Analytics Zoo's
``zoo.tfpark.KerasModel``, on Keras 3: code written for ``model.fit(x, y, ...)`` changes one name."""

from __future__ import annotations

import math

import numpy as np

from optim.optimizer import TFOptimizer

__all__ = ["KerasModel"]


class KerasModel:
    """A compiled Keras model trained and run by :class:`~optim.TFOptimizer` (locally, or over Spark for a
    DataFrame or RDD ``TFDataset``), with ``keras.Model``'s ``fit``, ``evaluate`` and ``predict``.

    Args:
        model: A compiled Keras model (``model.compile(optimizer, loss, metrics)``).
        model_dir: Where checkpoints go (``TFOptimizer``'s). Default: none.
        input_signature: A subclassed model's inputs, as :meth:`tfnet.TFNet.from_keras` takes them.

    Each call starts from the Keras model as it is then, as Keras's own calls do: its current weights (set since by
    ``set_weights`` or ``load_weights``), and after ``model.compile`` again (a new optimiser, loss or metrics; the
    trainable flags changed, as Keras's transfer-learning guide recompiles after ``base.trainable = True``), a new
    :class:`~optim.TFOptimizer` made from it.

    Attributes:
        model: The Keras model; ``fit`` writes the trained weights (batch norms' moving statistics included)
            back into it.
        optimizer: The :class:`~optim.TFOptimizer` that trains it (its ``net``, ``last_run``, ``optimize`` with
            tfnet's own options).
    """

    def __init__(self, model, model_dir: str | None = None, *, input_signature=None):
        self.model = model
        self._made_with = dict(model_dir=model_dir, input_signature=input_signature)
        self._compiled = None
        self._current()

    def _current(self) -> TFOptimizer:
        """The optimizer for the model as it is now: made again after a ``compile``, else given its weights."""
        compiled = getattr(self.model, "_compile_config", None)
        if compiled is None or compiled is not self._compiled:
            self.optimizer = TFOptimizer.from_keras(self.model, self._made_with["model_dir"],
                                                    input_signature=self._made_with["input_signature"])
            self._compiled = compiled
            return self.optimizer
        names = set(self.optimizer.net.weight_names)
        self.optimizer.net.set_weights({v.path: v.numpy() for v in self.model.weights if v.path in names})
        return self.optimizer

    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None, validation_split=0.0,
            validation_data=None, shuffle=True, class_weight=None, sample_weight=None, initial_epoch=0,
            steps_per_epoch=None, validation_steps=None, validation_batch_size=None, validation_freq=1, *,
            feature_cols=None, label_cols=None, **options):
        """Trains as ``keras.Model.fit`` (same arguments, a ``History`` back) and writes the trained weights into
        :attr:`model`. ``validation_split`` of arrays holds out their last rows, as Keras does (before shuffling);
        of a distributed ``TFDataset``, the rows ``TFOptimizer.optimize`` picks. ``x`` (and ``validation_data``) may
        be a Spark DataFrame with ``feature_cols`` and ``label_cols``, as BigDL Orca's ``Estimator.fit`` takes it
        (:func:`_frame`). ``options``: ``optimize``'s own (``num_workers``, ``resume``, ``checkpoint_every``, ...).

        Raises:
            ValueError: ``initial_epoch``, ``validation_steps`` or ``validation_freq`` other than their defaults
                (continue a run with ``resume=True`` and a ``model_dir``), or ``steps_per_epoch`` for data that is
                not distributed; nothing trained.
        """
        _refuse(initial_epoch=(initial_epoch, 0, "continue a run with resume=True and a model_dir"),
                validation_steps=(validation_steps, None, "validation runs over the whole validation data"),
                validation_freq=(validation_freq, 1, "validation runs at every epoch end (or every "
                                 "validate_every steps)"))
        x = _py_dataset(self._frame(x, feature_cols, label_cols, "fit"), shuffle, reset=True)
        validation_data = _py_dataset(self._frame(validation_data, feature_cols, label_cols, "fit"), False)
        data, weights = _data(x, y, sample_weight)
        if isinstance(validation_data, (tuple, list)):
            validation_data = tuple(_as_arrays(v) for v in validation_data)
        split = validation_split or None
        if split and validation_data is None and _arrays(data):
            data, validation_data = _last_rows(data, weights, split)
            weights, split = None, None
        elif weights is not None:
            options["sample_weight"] = weights
        if steps_per_epoch is not None:
            if not getattr(data, "distributed", False):
                raise ValueError("steps_per_epoch: tfnet trains over the whole data each epoch; it is for distributed "
                                 "data of unknown length (a TFDataset from tf.data with num_workers).")
            options["steps_per_epoch"] = steps_per_epoch
        if validation_batch_size is not None:
            options["validation_batch_size"] = validation_batch_size
        optimizer = self._current()
        try:
            return optimizer.optimize(data, epochs=epochs, batch_size=batch_size, validation_data=validation_data,
                                      shuffle=shuffle, verbose=verbose, callbacks=callbacks, class_weight=class_weight,
                                      validation_split=split, **options)
        finally:  # a run stopped by an error or Ctrl-C leaves the model where training got, as Keras's fit does
            self._write_back()

    def evaluate(self, x=None, y=None, batch_size=None, verbose="auto", sample_weight=None, steps=None, callbacks=None,
                 return_dict=False, num_workers=None, *, feature_cols=None, label_cols=None):
        """Loss and metrics as ``keras.Model.evaluate`` gives them: the loss alone where there is nothing else, else
        a list (the loss, then the compiled metrics in their order), or a dict with ``return_dict``. ``num_workers``:
        over Spark (``TFOptimizer.evaluate``); a Spark DataFrame with ``feature_cols`` and ``label_cols``, over Spark."""
        _refuse(steps=(steps, None, "evaluation runs over the whole data"),
                callbacks=(callbacks or None, None, "evaluate takes no callbacks in tfnet"))
        x = _py_dataset(self._frame(x, feature_cols, label_cols, "evaluate"), False, reset=True)
        data, weights = _data(x, y, sample_weight)
        if weights is not None:
            data = (*data, weights)
        logs = self._current().evaluate(data, batch_size, num_workers)
        return dict(logs) if return_dict else _in_kerass_order(self.model, dict(logs), data if _arrays(data) else None)

    def predict(self, x, batch_size=None, verbose="auto", steps=None, callbacks=None, *, feature_cols=None):
        """The outputs as ``keras.Model.predict`` gives them: an array for one output, else the model's output
        structure (a list, or a dict by output name). A distributed ``TFDataset``'s: as ``TFOptimizer.predict``
        (the DataFrame with output columns, or an RDD); a Spark DataFrame with ``feature_cols``, the same."""
        _refuse(steps=(steps, None, "prediction runs over the whole data"),
                callbacks=(callbacks or None, None, "predict takes no callbacks in tfnet"))
        x, _ = _data(_py_dataset(self._frame(x, feature_cols, None, "predict"), False), None, None)
        out = self._current().predict(x, batch_size)
        if not isinstance(out, list):
            return out
        structure = _output_structure(self.model)
        names = [n.split(":")[0] for n in self.optimizer.net.output_names]  # a dict's keys, as from_keras names them
        if isinstance(structure, dict) and sorted(structure) == sorted(names):
            return dict(zip(names, out))
        return out

    def _frame(self, x, feature_cols, label_cols, call: str):
        """``x`` as it is, or a Spark DataFrame (classic or Connect) as a ``TFDataset`` of its ``feature_cols`` and
        ``label_cols``, each feature column shaped as the model's input it feeds (one column per input), as BigDL
        Orca's ``Estimator`` takes a DataFrame."""
        if not (hasattr(x, "sparkSession") and hasattr(x, "schema")):
            return x
        if feature_cols is None or (call != "predict" and label_cols is None):
            raise ValueError(f"{call}() of a Spark DataFrame needs feature_cols" + ("" if call == "predict" else
                             " and label_cols") + ", the columns that feed the model's inputs (and its labels).")
        from optim.data import TFDataset

        columns = [feature_cols] if isinstance(feature_cols, str) else list(feature_cols)
        specs = self.optimizer.net.input_specs
        shapes = None
        if len(columns) == len(specs) and all(s.shape[1:].is_fully_defined() for s in specs):
            shapes = [tuple(s.shape[1:]) for s in specs]
        return TFDataset.from_dataframe(x, columns, label_cols, feature_shapes=shapes)

    def _write_back(self) -> None:
        weights = self.optimizer.net.get_weights()
        for variable in self.model.weights:
            if variable.path in weights:
                variable.assign(weights[variable.path])


def _py_dataset(x, shuffle: bool, reset: bool = False):
    """``x`` as it is, or a ``keras.utils.PyDataset`` as a ``tf.data.Dataset`` of its batches read through Keras's
    own adapter (its batch order shuffled with ``shuffle``, its workers' queue), each pass over it one epoch between
    the adapter's ``on_epoch_begin`` and ``on_epoch_end``, so the dataset's own hooks run as in Keras's calls;
    ``reset``: one ``on_epoch_end`` first, as the epoch iterator of Keras's ``fit`` and ``evaluate`` calls it when it
    resets (TensorFlow backend), before the first epoch."""
    import keras

    if not isinstance(x, keras.utils.PyDataset):
        return x
    import tensorflow as tf
    from keras.src.trainers.data_adapters import get_data_adapter

    adapter = get_data_adapter(x, shuffle=shuffle)
    spec = adapter.get_tf_dataset().element_spec  # Keras's: from its first batches
    if reset:
        adapter.on_epoch_end()

    def one_epoch():
        adapter.on_epoch_begin()
        try:
            yield from adapter.get_numpy_iterator()
        finally:
            adapter.on_epoch_end()

    return tf.data.Dataset.from_generator(one_epoch, output_signature=spec)


def _refuse(**arguments) -> None:
    for name, (given, default, instead) in arguments.items():
        if (given is not None) if default is None else (given != default):
            raise ValueError(f"{name}={given!r} is not supported: {instead}.")


def _data(x, y, sample_weight):
    """``optimize``'s data from Keras's ``x``, ``y`` (and the sample weights given apart, or None), arrays as
    Keras's array adapter makes them (:func:`_as_arrays`)."""
    if x is None:
        raise ValueError("x is required: arrays (with y), a tf.data.Dataset or a TFDataset.")
    weights = None if sample_weight is None else _as_arrays(sample_weight)
    if y is None:
        return (_as_arrays(x) if _array_like(x) else x), weights
    return (_as_arrays(x), _as_arrays(y)), weights


def _array_like(x) -> bool:
    import tensorflow as tf

    leaves = tf.nest.flatten(x)
    return bool(leaves) and all(hasattr(a, "__array__") or hasattr(a, "to_numpy") for a in leaves)


def _as_arrays(structure):
    """Each array of ``structure`` (a dict or list of them, or one) as Keras's array adapter reads it: a pandas
    DataFrame as its values, a Series as one column, a tensor as numpy, floats of another width as float32."""
    import tensorflow as tf

    def one(a):
        if hasattr(a, "to_numpy") and getattr(a, "ndim", 2) == 1:  # a pandas Series: one column, as Keras's
            a = np.expand_dims(a.to_numpy(), -1)
        a = a.to_numpy() if hasattr(a, "to_numpy") else np.asarray(a)
        return a.astype(np.float32) if a.dtype.kind == "f" and a.dtype != np.float32 else a

    return tf.nest.map_structure(one, structure)


def _arrays(data) -> bool:
    return isinstance(data, tuple) and all(isinstance(p, (np.ndarray, list, tuple, dict)) for p in data)


def _last_rows(data, weights, split: float):
    """Keras's ``validation_split`` of arrays: the last ``split`` of the rows held out (``floor(n * (1 - split))``
    rows kept), sample weights alike; ``(training data, validation data)``."""
    import tensorflow as tf

    if not 0.0 < split < 1.0:
        raise ValueError(f"validation_split must be between 0 and 1; received {split}.")
    parts = data + ((weights,) if weights is not None else ())
    rows = len(tf.nest.flatten(parts[0])[0])
    at = int(math.floor(rows * (1.0 - split)))
    if at == 0 or at == rows:
        raise ValueError(f"validation_split={split} of {rows} rows leaves one side empty.")
    head = tf.nest.map_structure(lambda a: np.asarray(a)[:at], parts)
    tail = tf.nest.map_structure(lambda a: np.asarray(a)[at:], parts)
    return head, tail


def _in_kerass_order(model, logs: dict, data):
    """``logs`` as the list ``keras.Model.evaluate`` returns (its ``_flatten_metrics_in_order``: the loss, then the
    compiled metrics or each output's loss as Keras names them, then the rest by name; one value alone), after
    Keras builds its compiled loss and metrics from a row of ``data`` (arrays; shapes only, nothing computed), as its
    own ``evaluate`` does first. Without Keras's method, or the build: the loss, then the rest by name."""
    import tensorflow as tf

    try:
        if data is not None:
            model._symbolic_build(data_batch=tf.nest.map_structure(lambda a: a[:1], tuple(data)))
        return model._flatten_metrics_in_order(logs)
    except Exception:  # noqa: BLE001 (a Keras without these private methods: tfnet's own order, as documented)
        ordered = [logs[k] for k in ["loss"] + sorted(k for k in logs if k != "loss") if k in logs]
        return ordered[0] if len(ordered) == 1 else ordered


def _output_structure(model):
    try:
        return model.output
    except (AttributeError, ValueError):  # a subclassed model has none
        return None
