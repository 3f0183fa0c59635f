"""Gradient transformations: pure update rules, factored as in optax.

A transformation is a pair of pure functions::

    state = t.init(params)                        # params: dict name -> tensor
    updates, state = t.update(grads, state, params)

``updates`` are deltas (``w <- w + update``: ``TFNet.apply_updates``). Behaviour is composed with
:func:`chain`; the named methods in ``optim.methods`` are such chains, e.g. Adam is
``chain(scale_by_adam(), scale_by_learning_rate(lr))`` and SGD with momentum is
``chain(scale_by_learning_rate(lr), trace(momentum))``.

* ``base``: the contract, :func:`chain`, :func:`identity`, :func:`set_to_zero`, argument checks;
* ``adaptive``: Lion's, Adamax's and Nadam's directions (``scale_by_lion``, ``scale_by_adamax``, ``scale_by_nadam``);
* ``relative``: Adadelta's and Lamb's directions, Adafactor's and FTRL's updates (``scale_by_adadelta``,
  ``scale_by_lamb``, ``adafactor``, ``ftrl``), the last three reading the weights;
* ``keras_recent``: schedule-free AdamW's and Muon's updates (``schedule_free_adamw``, ``muon``);
* ``scale``: directions and scales (``scale_by_adam``, ``scale_by_rms``, ``scale_by_adagrad``,
  ``scale_by_trust_ratio``, ``scale_by_learning_rate``, ``trace``);
* ``clipping``, ``weight_decay``, ``partitioning`` (per-group transforms: :func:`partition`).
"""

from optim.transforms.accumulation import AccumulationState, accumulate_gradients
from optim.transforms.adaptive import (
    ScaleByAdamaxState,
    ScaleByLionState,
    ScaleByNadamState,
    scale_by_adamax,
    scale_by_lion,
    scale_by_nadam,
)
from optim.transforms.base import (
    CountState,
    EmptyState,
    GradientTransformation,
    Params,
    Schedule,
    chain,
    check_non_negative,
    check_unit_interval,
    identity,
    set_to_zero,
)
from optim.transforms.clipping import clip, clip_by_global_norm, clip_by_norm
from optim.transforms.ema import EmaState, weight_average
from optim.transforms.keras_recent import MuonState, ScheduleFreeState, muon, schedule_free_adamw
from optim.transforms.partitioning import PartitionState, assign_groups, matcher, partition
from optim.transforms.relative import (
    AdafactorState,
    FtrlState,
    ScaleByAdadeltaState,
    ScaleByLambState,
    adafactor,
    ftrl,
    scale_by_adadelta,
    scale_by_lamb,
)
from optim.transforms.scale import (
    ScaleByAdagradState,
    ScaleByAdamState,
    ScaleByRmsState,
    TraceState,
    scale_by_adagrad,
    scale_by_adam,
    scale_by_learning_rate,
    scale_by_rms,
    scale_by_trust_ratio,
    trace,
)
from optim.transforms.weight_decay import add_decayed_weights, decoupled_weight_decay

__all__ = [
    "GradientTransformation",
    "Params",
    "Schedule",
    "EmptyState",
    "CountState",
    "PartitionState",
    "ScaleByAdamState",
    "ScaleByRmsState",
    "ScaleByAdagradState",
    "TraceState",
    "chain",
    "identity",
    "set_to_zero",
    "check_non_negative",
    "check_unit_interval",
    "clip",
    "clip_by_norm",
    "clip_by_global_norm",
    "add_decayed_weights",
    "decoupled_weight_decay",
    "matcher",
    "assign_groups",
    "partition",
    "scale_by_adam",
    "accumulate_gradients",
    "weight_average",
    "EmaState",
    "AccumulationState",
    "scale_by_adamax",
    "scale_by_lion",
    "scale_by_adadelta",
    "scale_by_lamb",
    "adafactor",
    "ftrl",
    "muon",
    "schedule_free_adamw",
    "MuonState",
    "ScheduleFreeState",
    "FtrlState",
    "ScaleByAdadeltaState",
    "ScaleByLambState",
    "AdafactorState",
    "scale_by_nadam",
    "ScaleByAdamaxState",
    "ScaleByLionState",
    "ScaleByNadamState",
    "scale_by_rms",
    "scale_by_adagrad",
    "scale_by_learning_rate",
    "scale_by_trust_ratio",
    "trace",
]
