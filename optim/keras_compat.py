"""Mapping a compiled Keras model's optimiser, loss and metrics to tfnet's."""

from __future__ import annotations

import re
import warnings

from optim import losses as L
from optim import methods
from optim import metrics as M
from optim import output_metrics as OM
from optim.errors import KerasMappingError, KerasTrainingWarning
from tfnet import TFNet
from tfnet.keras_training import renormalized_batch_norms, unswitched_random_layers


def _learning_rate(opt):
    import keras

    schedule = getattr(opt, "_learning_rate", None)
    if isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
        return schedule  # callable step -> lr, made of ops: runs inside the compiled step
    return float(opt.learning_rate.numpy() if hasattr(opt.learning_rate, "numpy") else opt.learning_rate)


def _exactly(names: list[str]) -> str:
    """A pattern that matches these weight names (Keras's variable paths) and nothing else."""
    return "^(?:" + "|".join(re.escape(n) for n in names) + ")$"


def _excluded_from_weight_decay(opt, variables) -> str | None:
    """The variables (by path, which is the net's weight name) that Keras's optimiser leaves out of its weight decay
    (``opt.exclude_from_weight_decay(var_list=..., var_names=...)``), decided by Keras's own ``_use_weight_decay``, as
    one anchored pattern; None where it leaves out none."""
    decides = getattr(opt, "_use_weight_decay", None)
    if not callable(decides):
        return None
    names = [v.path for v in variables if not decides(v)]
    return _exactly(names) if names else None


def _adamw_weights(opt, variables) -> str:
    """The variables (by path) Keras's ``Muon`` steps with AdamW, decided by its own ``_should_use_adamw`` (rank, an
    embedding's, ``exclude_layers``), as one anchored pattern (one that matches nothing where there are none)."""
    names = [v.path for v in variables if opt._should_use_adamw(v)]
    return _exactly(names) if names else "(?!)"


def _map_multi_optimizer(opt, variables) -> dict:
    """Keras's ``MultiOptimizer`` (an ``OptimizerMap`` of patterns, or a function of the variable) as tfnet's per-group
    methods: each sub-optimiser mapped, keyed by the exact names of the variables Keras gives it."""
    if opt.loss_scale_factor:  # read, not get_config (which serializes a selector function with a warning)
        raise KerasMappingError(f"The Keras optimiser scales the loss, which tfnet does not map. Received: "
                                f"loss_scale_factor={opt.loss_scale_factor}")
    groups: dict[int, tuple] = {}
    for v in variables:
        sub = opt._optimizer_map(v)  # Keras's own choice, as its build makes it
        groups.setdefault(id(sub), (sub, []))[1].append(v)
    if not groups:
        raise KerasMappingError("The Keras MultiOptimizer has no variable to train.")
    return {re.compile(_exactly([v.path for v in group])): map_optimizer(sub, group) for sub, group in groups.values()}


def map_optimizer(opt, variables=()):
    """tfnet's method for a Keras optimiser; ``variables``: the model's trainable variables (for the weights its weight
    decay leaves out). A ``MultiOptimizer`` gives a dict of per-group methods, as ``TFOptimizer`` takes them."""
    import keras

    if isinstance(opt, keras.optimizers.MultiOptimizer):
        return _map_multi_optimizer(opt, list(variables))
    if isinstance(opt, keras.optimizers.LossScaleOptimizer):
        # scaling the loss by a power of two and the gradients back is exact in float32: the inner optimiser's steps;
        # a step whose gradients are not finite, which Keras skips, is tfnet's on_nonfinite's to decide
        return map_optimizer(opt.inner_optimizer, variables)
    cfg = opt.get_config()
    if cfg.get("loss_scale_factor"):
        raise KerasMappingError(f"The Keras optimiser scales the loss, which tfnet does not map. Received: "
                                f"loss_scale_factor={cfg.get('loss_scale_factor')}")
    common = {k: cfg.get(k) for k in ("clipnorm", "clipvalue", "global_clipnorm", "gradient_accumulation_steps")}
    if cfg.get("use_ema"):
        common.update(use_ema=True, ema_momentum=cfg["ema_momentum"], ema_overwrite_frequency=cfg["ema_overwrite_frequency"])
    lr = _learning_rate(opt)
    wd = cfg.get("weight_decay")
    if wd or cfg.get("adam_weight_decay"):
        common["exclude_from_weight_decay"] = _excluded_from_weight_decay(opt, variables)
    kinds = {
        keras.optimizers.SGD: lambda: methods.SGD(lr, cfg["momentum"], cfg["nesterov"], weight_decay=wd, **common),
        keras.optimizers.AdamW: lambda: methods.AdamW(lr, wd, cfg["beta_1"], cfg["beta_2"], cfg["epsilon"],
                                                      cfg["amsgrad"], **common),
        keras.optimizers.Adam: lambda: methods.Adam(lr, cfg["beta_1"], cfg["beta_2"], cfg["epsilon"], cfg["amsgrad"],
                                                    weight_decay=wd, **common),
        keras.optimizers.RMSprop: lambda: methods.RMSprop(lr, cfg["rho"], cfg["momentum"], cfg["epsilon"],
                                                          cfg["centered"], weight_decay=wd, **common),
        keras.optimizers.Adagrad: lambda: methods.Adagrad(lr, cfg["initial_accumulator_value"], cfg["epsilon"],
                                                          weight_decay=wd, **common),
        keras.optimizers.Adamax: lambda: methods.Adamax(lr, cfg["beta_1"], cfg["beta_2"], cfg["epsilon"],
                                                        weight_decay=wd, **common),
        keras.optimizers.Nadam: lambda: methods.Nadam(lr, cfg["beta_1"], cfg["beta_2"], cfg["epsilon"],
                                                      weight_decay=wd, **common),
        keras.optimizers.Lion: lambda: methods.Lion(lr, cfg["beta_1"], cfg["beta_2"], weight_decay=wd, **common),
        keras.optimizers.Adadelta: lambda: methods.Adadelta(lr, cfg["rho"], cfg["epsilon"], weight_decay=wd, **common),
        keras.optimizers.Lamb: lambda: methods.Lamb(lr, cfg["beta_1"], cfg["beta_2"], cfg["epsilon"], weight_decay=wd,
                                                    **common),
        keras.optimizers.Adafactor: lambda: methods.Adafactor(lr, cfg["beta_2_decay"], cfg["epsilon_1"],
                                                              cfg["epsilon_2"], cfg["clip_threshold"],
                                                              cfg["relative_step"], weight_decay=wd, **common),
        keras.optimizers.ScheduleFreeAdamW: lambda: methods.ScheduleFreeAdamW(
            lr, cfg["beta_1"], cfg["beta_2"], cfg["epsilon"], cfg["warmup_steps"], weight_decay=wd, **common),
        keras.optimizers.Muon: lambda: methods.Muon(
            lr, cfg["adam_beta_1"], cfg["adam_beta_2"], cfg["adam_weight_decay"], cfg["epsilon"], wd,
            adam_lr_ratio=cfg["adam_lr_ratio"], momentum=cfg["momentum"], ns_steps=cfg["ns_steps"],
            nesterov=cfg["nesterov"], rms_rate=cfg["rms_rate"], muon_a=cfg["muon_a"], muon_b=cfg["muon_b"],
            muon_c=cfg["muon_c"], adamw_weights=_adamw_weights(opt, variables), **common),
        keras.optimizers.Ftrl: lambda: methods.Ftrl(lr, cfg["learning_rate_power"], cfg["initial_accumulator_value"],
                                                    cfg["l1_regularization_strength"], cfg["l2_regularization_strength"],
                                                    cfg["l2_shrinkage_regularization_strength"], cfg["beta"],
                                                    weight_decay=wd, **common),
    }
    make = kinds.get(type(opt))
    if make is None:
        raise KerasMappingError(
            f"tfnet cannot map the Keras optimiser {type(opt).__name__}; supported: "
            f"{sorted(c.__name__ for c in kinds)}. Use TFOptimizer.from_loss with an optim method."
        )
    return make()


def map_loss(loss) -> L.Loss:
    """A loss as Keras's ``compile`` takes it (a name, a ``keras.losses.Loss``, a function of per-example losses) as
    tfnet's: its own where it computes the same, else Keras's, called as ``compile`` calls it (:class:`optim.losses.
    KerasLoss`: a function wrapped as Keras wraps it, so its per-example values are averaged as in ``fit``)."""
    mapped = L.from_keras(loss)
    if mapped is not None:
        return mapped
    if callable(loss) and not isinstance(loss, (str, L.Loss)):
        return L.KerasLoss(loss)
    return L.get(loss)


def _named_metric(name: str) -> M.Metric:
    """A metric named as ``compile`` takes it: tfnet's where it computes Keras's (``"accuracy"``, ``"mae"``, ...),
    else the Keras metric of that name (``"auc"``, ``"precision"``), named so."""
    import keras

    try:
        mapped = M.get(name)
    except ValueError:
        mapped = None
    if mapped is not None and not isinstance(mapped, M.AUC):  # tfnet's AUC is a histogram's, not Keras's
        return mapped
    try:
        found = keras.metrics.get(name)
    except ValueError:
        return M.get(name)  # tfnet's message: the names it knows
    mapped = map_metric(found) if isinstance(found, keras.metrics.Metric) else M.get(found)  # a function: averaged
    mapped.name = name
    return mapped


def map_metric(metric) -> M.Metric:
    """tfnet's own metric where it computes what the Keras metric does (its default settings), else the Keras metric
    itself (:class:`optim.metrics.KerasMetric`: an AUC, a ``Precision``, a ``BinaryAccuracy(threshold=0.7)``), so the
    history holds ``fit``'s values; names and callables as :func:`optim.metrics.get` takes them."""
    import keras

    if isinstance(metric, str):
        return _named_metric(metric)
    if callable(metric) and not isinstance(metric, keras.metrics.Metric):
        return M.get(metric)
    config = metric.get_config()
    table = {
        keras.metrics.SparseCategoricalAccuracy: lambda: M.Accuracy(),
        keras.metrics.CategoricalAccuracy: lambda: M.Accuracy(),
        keras.metrics.BinaryAccuracy: lambda: M.Accuracy() if config.get("threshold", 0.5) == 0.5 else None,
        keras.metrics.SparseTopKCategoricalAccuracy: lambda: M.TopKAccuracy(config.get("k", 5)),
        keras.metrics.TopKCategoricalAccuracy: lambda: M.TopKAccuracy(config.get("k", 5)),
        keras.metrics.MeanAbsoluteError: lambda: M.MeanAbsoluteError(),
        keras.metrics.MeanSquaredError: lambda: M.MeanSquaredError(),
    }
    make = table.get(type(metric))
    mapped = make() if make is not None else None
    if mapped is None:
        try:
            return M.KerasMetric(metric)
        except TypeError as exc:
            raise KerasMappingError(str(exc)) from None
    if getattr(metric, "name", None):  # the name the user gave it, as Keras reports it
        mapped.name = metric.name
    return mapped


def _check_own_training(model) -> None:
    """A model that overrides how Keras trains it (``train_step``, ``compute_loss``: a GAN's, a VAE's) is refused:
    tfnet's step is the compiled loss of the outputs, and would train something else without a word."""
    import keras

    for method in ("train_step", "compute_loss"):
        if getattr(type(model), method, None) is not getattr(keras.Model, method):
            raise KerasMappingError(
                f"The Keras model {type(model).__name__} overrides Model.{method}, which tfnet does not run: it "
                "trains the compiled loss of the model's outputs. Write the step's loss as a function of the outputs "
                "and use TFOptimizer.from_loss(TFNet.from_keras(model), loss, optim_method)."
            )


def from_compiled_keras(model, input_signature=None):
    """``(net, loss, method, metrics, loss_weights, weighted_metrics)`` for a compiled Keras model:
    one loss, a list or a dict of them (by output name), with the model's ``loss_weights``; ``input_signature`` as
    :meth:`TFNet.from_keras` takes it (a subclassed model's)."""
    config = getattr(model, "_compile_config", None)
    if getattr(model, "optimizer", None) is None or config is None:
        raise KerasMappingError("The Keras model is not compiled; call model.compile(optimizer, loss, metrics) first.")
    cfg = config.config
    loss = cfg.get("loss")
    if loss is None:
        raise KerasMappingError("The Keras model was compiled without a loss.")
    if isinstance(loss, dict):
        loss = {k: None if v is None else map_loss(v) for k, v in loss.items()}
    elif isinstance(loss, (list, tuple)):
        loss = [None if v is None else map_loss(v) for v in loss]
    else:
        loss = map_loss(loss)
    _check_own_training(model)
    unswitched = unswitched_random_layers(model)
    if unswitched:
        warnings.warn(f"tfnet trains the layers {unswitched} in inference mode: their training-time randomness (a "
                      "recurrent layer's dropout, a random augmentation) is not drawn, where Keras's fit draws it. "
                      "Dropout and noise layers (Dropout, GaussianNoise, ...) are drawn as fit draws them.",
                      KerasTrainingWarning, stacklevel=3)
    norms = renormalized_batch_norms(model)
    if norms:
        warnings.warn(f"tfnet trains the BatchNormalization layers {norms[:5]}{' ...' if len(norms) > 5 else ''} in "
                      "inference mode (their moving statistics, which stay as they are), where Keras's fit "
                      "renormalizes them (renorm=True). Set layer.trainable = False on them for fit's result in "
                      "inference mode, or renorm=False.", KerasTrainingWarning, stacklevel=3)
    net = TFNet.from_keras(model, input_signature=input_signature, train_batch_norm=True)  # as fit trains them
    net.trainable = [v.path for v in model.trainable_variables if v.path in net.weight_names]
    outputs = list(net.output_names)
    metrics = _compiled_metrics(cfg.get("metrics"), outputs)
    weighted = _compiled_metrics(cfg.get("weighted_metrics"), outputs)
    for m in metrics + weighted:  # F1Score's per-class counts, built on the output's shape as fit's first batch would
        if getattr(m, "pending", False):
            try:
                m.bind_shape(net.output_specs[m.output_index or 0].shape)
            except TypeError as exc:
                raise KerasMappingError(str(exc)) from None
    return (net, loss, map_optimizer(model.optimizer, model.trainable_variables), OM.unique_names(metrics),
            cfg.get("loss_weights"), _weighted_names(weighted, {m.name for m in metrics}, outputs))


def _mapped(entry):
    """One output's entry of ``compile(metrics=...)`` mapped: a metric, a list of them, or None."""
    if entry is None:
        return None
    return [map_metric(m) for m in entry] if isinstance(entry, (list, tuple)) else map_metric(entry)


def _compiled_metrics(given, outputs: list[str]) -> list[M.Metric]:
    """``compile``'s ``metrics`` (or ``weighted_metrics``) as Keras's compile reads them: for one output, every
    metric given (a list, or a dict's values), named as given; for several, a dict by output name or a list of one
    entry per output, each output's metrics named ``{output}_{metric}``."""
    if not given:
        return []
    if len(outputs) == 1:
        import keras

        return [map_metric(m) for m in keras.tree.flatten(given)]
    if isinstance(given, dict):
        mapped = {k: _mapped(v) for k, v in given.items()}
    else:
        mapped = [_mapped(v) for v in given]
    try:
        return OM.for_outputs(mapped, outputs, per_output_list=True)
    except ValueError as exc:
        raise KerasMappingError(str(exc)) from None


def _weighted_names(weighted: list[M.Metric], taken: set[str], outputs: list[str]) -> list[M.Metric]:
    """A weighted metric whose name a metric has is ``weighted_<name>`` (``score_weighted_<name>`` for an output's),
    then ``_1``, ``_2``... as Keras's compile names them."""
    for m in weighted:
        if m.name in taken:
            prefix = OM.output_label(outputs[m.output_index]) + "_" if m.output_index is not None else ""
            m.name = f"{prefix}weighted_{m.name[len(prefix):]}"
        OM.unique_names([m], taken)
    return weighted
