"""Optimisation methods: named, validated chains of transforms, with Keras 3's names, defaults and
formulas (SGD adds PyTorch's dampening; LARS follows You et al., 2017).

Each method is itself a gradient transformation (``init`` / ``update``). Options shared by all:

* ``clipnorm``, ``clipvalue``, ``global_clipnorm``: gradient clipping, as in Keras (applied first);
* ``l2``: L2 weight decay added to the gradient (``g + l2 * w``);
* ``weight_decay``: decoupled weight decay, as Keras' ``weight_decay`` (``w <- w - w * wd * lr``);
* ``gradient_accumulation_steps``: update every that many steps, with the mean of their gradients (Keras's option of
  that name: a batch that many times larger, in parts);
* ``use_ema``, ``ema_momentum`` (0.99), ``ema_overwrite_frequency``: a moving average of the weights, which they take
  every that many steps and when training ends (Keras's options of those names);
* ``exclude_from_weight_decay``: the weights ``weight_decay`` leaves alone, as Keras's optimizer method of that name
  takes ``var_names``: a list of strings, a weight excluded where any of them occurs in its name (``["bias",
  "gamma"]``; tfnet's names are paths, ``"dense/bias"``, where Keras searches the variable's own name), or one
  regular expression searched in each name.

``learning_rate`` is a float or a schedule (``optim.schedules``, or any ``step -> lr`` callable
made of TensorFlow ops, Keras ``LearningRateSchedule`` objects included).
"""

from __future__ import annotations

import re
from typing import Any

import tensorflow as tf

from optim import transforms as T

__all__ = ["Method", "SGD", "Adam", "AdamW", "RMSprop", "Adagrad", "Adadelta", "Adamax", "Nadam", "Lion", "Lamb",
           "Adafactor", "Ftrl", "ScheduleFreeAdamW", "Muon", "LARS"]


class Method:
    """Base class: a named chain of transforms. Subclasses call ``_finish`` in ``__init__``.

    Every method is ``chain([clip], [l2], *direction, [decay], scale_by_learning_rate(lr),
    [momentum], [decay])``: clipping and L2 act on the raw gradient, ``direction`` is the
    method's preconditioner (none for SGD), and momentum, where the method has one, is a
    :func:`~optim.transforms.trace` after the rate, so that it accumulates ``lr * d`` as Keras'
    SGD and RMSprop do (the same numbers under a schedule). Decoupled ``weight_decay`` goes
    before the rate when there is no momentum (optax's AdamW); with momentum it goes last, with
    its own reading of the rate, so that it stays out of the momentum as in Keras.
    """

    learning_rate: Any
    _chain: T.GradientTransformation

    def init(self, params):
        return self._chain.init(params)

    def update(self, grads, state, params=None):
        return self._chain.update(grads, state, params)

    def final_weights(self, state) -> dict | None:
        """The weights training ends with, from the optimiser state, where the method says (``use_ema``: the moving
        average, as Keras's ``finalize_variable_values`` at the end of ``fit``); None: the weights as they are."""
        return dict(state.average) if getattr(self, "use_ema", False) else None

    def learning_rate_at(self, step) -> float:
        lr = self.learning_rate
        return float(lr(tf.constant(step, tf.int64)) if callable(lr) else lr)

    def get_config(self) -> dict:
        """The method's hyperparameters as it was made with them (Keras's optimizer ``get_config``)."""
        return dict(self._config)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._config.items())
        return f"{type(self).__name__}({args})"

    def _finish(self, direction, momentum, *, clipnorm, clipvalue, global_clipnorm, l2, weight_decay, config,
                exclude_from_weight_decay=None, gradient_accumulation_steps=None, use_ema=False, ema_momentum=0.99,
                ema_overwrite_frequency=None, rate_inside=False):
        if sum(x is not None for x in (clipnorm, clipvalue, global_clipnorm)) > 1:
            raise ValueError(
                "Give at most one of `clipnorm`, `clipvalue` and `global_clipnorm`. Received: "
                f"clipnorm={clipnorm}, clipvalue={clipvalue}, global_clipnorm={global_clipnorm}"
            )
        rate = self.learning_rate
        if gradient_accumulation_steps is not None and callable(rate):
            # Keras reads a schedule at its step count, not its update count: at the k-th update, step k * n - 1
            rate = _at_steps(rate, gradient_accumulation_steps)
        parts = []
        if clipnorm is not None:
            parts.append(T.clip_by_norm(clipnorm))
        if clipvalue is not None:
            parts.append(T.clip(clipvalue))
        if global_clipnorm is not None:
            parts.append(T.clip_by_global_norm(global_clipnorm))
        if l2:
            parts.append(T.add_decayed_weights(l2))
        decayed = _decay_mask(exclude_from_weight_decay)
        #: whether the update is the rate times what does not depend on it, so that a callback may scale it
        self.scales_with_rate = not rate_inside and not (callable(direction) and weight_decay)
        if callable(direction):  # a rule that reads the weights after the step's decay (Lamb's, Adafactor's)
            direction = direction(rate, (weight_decay, rate, decayed))
        parts.extend(direction)
        if not rate_inside:  # else the rule's update is the whole step, its rate and decay in it (Adafactor's)
            if weight_decay and momentum is None:
                parts.append(T.add_decayed_weights(weight_decay, decayed))
            parts.append(T.scale_by_learning_rate(rate))
            if momentum is not None:
                parts.append(momentum)
                if weight_decay:
                    parts.append(T.decoupled_weight_decay(weight_decay, rate, decayed))
        self._chain = T.chain(*parts)
        if gradient_accumulation_steps is not None:
            self._chain = T.accumulate_gradients(self._chain, gradient_accumulation_steps)
        self.use_ema = bool(use_ema)
        if self.use_ema:
            if gradient_accumulation_steps is not None:
                raise ValueError("Give `use_ema` or `gradient_accumulation_steps`, not both.")
            self._chain = T.weight_average(self._chain, 0.99 if ema_momentum is None else ema_momentum,
                                           ema_overwrite_frequency)
        self._config = config


def _at_steps(schedule, steps: int):
    """``schedule`` read at the step count of an update count (``k -> k * steps + steps - 1``): where Keras's
    accumulating optimiser reads it."""
    def at_update(count):
        return schedule(count * steps + (steps - 1))

    return at_update


def _decay_mask(exclude):
    """``name -> bool``: whether ``weight_decay`` decays the weight (None: every weight), from
    ``exclude_from_weight_decay``: strings joined into one pattern as Keras joins ``var_names``, or a regex."""
    if exclude is None:
        return None
    if isinstance(exclude, str):
        pattern = re.compile(exclude)
    elif isinstance(exclude, re.Pattern):
        pattern = exclude
    elif isinstance(exclude, (list, tuple, set, frozenset)) and all(isinstance(e, str) and e for e in exclude):
        if not exclude:
            return None
        pattern = re.compile("|".join(sorted(set(exclude))))
    else:
        raise TypeError("`exclude_from_weight_decay` must be a list of non-empty strings or a regular expression. "
                        f"Received: exclude_from_weight_decay={exclude!r}")
    return lambda name: pattern.search(name) is None


def _common(kwargs):
    allowed = {"clipnorm", "clipvalue", "global_clipnorm", "l2", "weight_decay", "exclude_from_weight_decay",
               "gradient_accumulation_steps", "use_ema", "ema_momentum", "ema_overwrite_frequency"}
    unknown = set(kwargs) - allowed
    if unknown:
        raise TypeError(f"Unknown arguments {sorted(unknown)}; options shared by all methods are {sorted(allowed)}.")
    return {k: kwargs.get(k) for k in allowed}


class SGD(Method):
    """Stochastic gradient descent with optional momentum, Nesterov momentum and dampening:
    ``chain(scale_by_learning_rate(lr), trace(momentum, nesterov, dampening))``.

    The rate comes before the momentum because Keras' SGD keeps ``v <- m v - lr g`` (the trace
    holds past rates); ``trace`` first and the rate last (optax's ``sgd``) is the same only for a
    constant rate.

    Args:
        learning_rate: Default 0.01.
        momentum: Default 0.0.
        nesterov: Default False.
        dampening: Scales the gradient by ``1 - dampening`` in the momentum from the second step on
            (PyTorch's ``dampening``). Default 0.0.
    """

    def __init__(self, learning_rate=0.01, momentum=0.0, nesterov=False, dampening=0.0, **kwargs):
        self.learning_rate = learning_rate
        T.check_unit_interval("momentum", momentum, closed_right=True)
        T.check_unit_interval("dampening", dampening, closed_right=True)
        if nesterov and (not momentum or dampening):
            raise ValueError(
                f"Nesterov momentum needs momentum > 0 and no dampening. Received: momentum={momentum}, "
                f"dampening={dampening}"
            )
        c = _common(kwargs)
        self._finish(
            [], T.trace(momentum, nesterov, dampening) if momentum else None, **c,
            config=dict(learning_rate=learning_rate, momentum=momentum, nesterov=nesterov, dampening=dampening,
                        **{k: v for k, v in c.items() if v is not None}),
        )


class Adam(Method):
    """Adam (Keras 3 formula): ``chain(scale_by_adam(beta_1, beta_2, epsilon, amsgrad),
    scale_by_learning_rate(lr))``. Defaults: learning_rate 0.001, beta_1 0.9, beta_2 0.999,
    epsilon 1e-7, amsgrad False."""

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7, amsgrad=False, **kwargs):
        self.learning_rate = learning_rate
        c = _common(kwargs)
        self._finish(
            [T.scale_by_adam(beta_1, beta_2, epsilon, amsgrad)], None, **c,
            config=dict(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon, amsgrad=amsgrad,
                        **{k: v for k, v in c.items() if v is not None}),
        )


class AdamW(Adam):
    """Adam with decoupled weight decay (Keras 3's AdamW): ``chain(scale_by_adam(...),
    add_decayed_weights(weight_decay), scale_by_learning_rate(lr))``. Default weight_decay 0.004."""

    def __init__(self, learning_rate=0.001, weight_decay=0.004, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
                 amsgrad=False, **kwargs):
        if weight_decay is None or weight_decay < 0:
            raise ValueError(f"`weight_decay` must be a non-negative float. Received: weight_decay={weight_decay}")
        super().__init__(learning_rate, beta_1, beta_2, epsilon, amsgrad, weight_decay=weight_decay, **kwargs)


class RMSprop(Method):
    """RMSprop (Keras 3 formula): ``chain(scale_by_rms(rho, epsilon, centered),
    scale_by_learning_rate(lr), [trace(momentum)])``, the rate inside the momentum as in Keras.
    Defaults: learning_rate 0.001, rho 0.9, momentum 0.0, epsilon 1e-7, centered False."""

    def __init__(self, learning_rate=0.001, rho=0.9, momentum=0.0, epsilon=1e-7, centered=False, **kwargs):
        self.learning_rate = learning_rate
        T.check_unit_interval("momentum", momentum, closed_right=True)
        c = _common(kwargs)
        self._finish(
            [T.scale_by_rms(rho, epsilon, centered)], T.trace(momentum) if momentum > 0 else None, **c,
            config=dict(learning_rate=learning_rate, rho=rho, momentum=momentum, epsilon=epsilon, centered=centered,
                        **{k: v for k, v in c.items() if v is not None}),
        )


class Adagrad(Method):
    """Adagrad (Keras 3 formula): ``chain(scale_by_adagrad(initial_accumulator_value, epsilon),
    scale_by_learning_rate(lr))``. Defaults: learning_rate 0.001, initial_accumulator_value 0.1,
    epsilon 1e-7."""

    def __init__(self, learning_rate=0.001, initial_accumulator_value=0.1, epsilon=1e-7, **kwargs):
        self.learning_rate = learning_rate
        c = _common(kwargs)
        self._finish(
            [T.scale_by_adagrad(initial_accumulator_value, epsilon)], None, **c,
            config=dict(learning_rate=learning_rate, initial_accumulator_value=initial_accumulator_value,
                        epsilon=epsilon, **{k: v for k, v in c.items() if v is not None}),
        )


class _MomentsMethod(Method):
    """A method whose direction is ``_direction(beta_1, beta_2, epsilon)`` (Adamax's, Nadam's), then the rate."""

    _direction: Any

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7, **kwargs):
        self.learning_rate = learning_rate
        c = _common(kwargs)
        self._finish(
            [type(self)._direction(beta_1, beta_2, epsilon)], None, **c,
            config=dict(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
                        **{k: v for k, v in c.items() if v is not None}),
        )


class Adamax(_MomentsMethod):
    """Adamax (Keras 3 formula): ``chain(scale_by_adamax(beta_1, beta_2, epsilon), scale_by_learning_rate(lr))``.
    Defaults: learning_rate 0.001, beta_1 0.9, beta_2 0.999, epsilon 1e-7."""

    _direction = staticmethod(T.scale_by_adamax)


class Nadam(_MomentsMethod):
    """Nadam (Keras 3 formula, its momentum schedule included): ``chain(scale_by_nadam(beta_1, beta_2, epsilon),
    scale_by_learning_rate(lr))``. Defaults: learning_rate 0.001, beta_1 0.9, beta_2 0.999, epsilon 1e-7."""

    _direction = staticmethod(T.scale_by_nadam)


class Lion(Method):
    """Lion (Chen et al., 2023; Keras 3 formula): ``chain(scale_by_lion(beta_1, beta_2), scale_by_learning_rate(lr))``:
    the sign of an interpolated momentum. Defaults: learning_rate 0.001, beta_1 0.9, beta_2 0.99."""

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.99, **kwargs):
        self.learning_rate = learning_rate
        c = _common(kwargs)
        self._finish(
            [T.scale_by_lion(beta_1, beta_2)], None, **c,
            config=dict(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
                        **{k: v for k, v in c.items() if v is not None}),
        )


class Adadelta(Method):
    """Adadelta (Keras 3 formula): ``chain(scale_by_adadelta(rho, epsilon), scale_by_learning_rate(lr))``. Defaults:
    learning_rate 0.001, rho 0.95, epsilon 1e-7."""

    def __init__(self, learning_rate=0.001, rho=0.95, epsilon=1e-7, **kwargs):
        self.learning_rate = learning_rate
        c = _common(kwargs)
        self._finish(
            [T.scale_by_adadelta(rho, epsilon)], None, **c,
            config=dict(learning_rate=learning_rate, rho=rho, epsilon=epsilon,
                        **{k: v for k, v in c.items() if v is not None}),
        )


class Lamb(Method):
    """Lamb (You et al., 2019; Keras 3 formula): ``chain(scale_by_lamb(beta_1, beta_2, epsilon),
    scale_by_learning_rate(lr))``, Adam's direction scaled per weight by ``||w|| / ||d||``, the weights read after the
    step's ``weight_decay`` as Keras reads them. Defaults: learning_rate 0.001, beta_1 0.9, beta_2 0.999, epsilon 1e-6."""

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-6, **kwargs):
        self.learning_rate = learning_rate
        c = _common(kwargs)
        self._finish(
            lambda rate, decay: [T.scale_by_lamb(beta_1, beta_2, epsilon, decay)], None, **c,
            config=dict(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
                        **{k: v for k, v in c.items() if v is not None}),
        )


class Adafactor(Method):
    """Adafactor (Shazeer and Stern, 2018; Keras 3 formula): a matrix's second moment kept as its row and column
    means, a step relative to the weights' RMS, ``min(lr, 1 / sqrt(t))`` its rate, the update clipped to an RMS of
    ``clip_threshold``. Defaults as Keras's: learning_rate 0.001, beta_2_decay -0.8, epsilon_1 1e-30, epsilon_2 1e-3,
    clip_threshold 1.0, relative_step True (Keras's step reads ``min(lr, 1 / sqrt(t))`` either way).

    Raises:
        ValueError: ``gradient_accumulation_steps`` (not mapped for it).
    """

    def __init__(self, learning_rate=0.001, beta_2_decay=-0.8, epsilon_1=1e-30, epsilon_2=1e-3, clip_threshold=1.0,
                 relative_step=True, **kwargs):
        self.learning_rate = learning_rate
        c = _common(kwargs)
        _no_accumulation(c, "Adafactor")
        self._finish(
            lambda rate, decay: [T.adafactor(rate, beta_2_decay, epsilon_1, epsilon_2, clip_threshold, decay)], None,
            **c, rate_inside=True,
            config=dict(learning_rate=learning_rate, beta_2_decay=beta_2_decay, epsilon_1=epsilon_1,
                        epsilon_2=epsilon_2, clip_threshold=clip_threshold, relative_step=relative_step,
                        **{k: v for k, v in c.items() if v is not None}),
        )


class Ftrl(Method):
    """FTRL-proximal (McMahan et al., 2013; Keras 3 formula), for wide and sparse linear models: the weights solved
    from an accumulated linear term, with ``l1_regularization_strength``, ``l2_regularization_strength``,
    ``l2_shrinkage_regularization_strength`` and ``beta``. Defaults as Keras's: learning_rate 0.001,
    learning_rate_power -0.5, initial_accumulator_value 0.1, the rest 0.

    Raises:
        ValueError: ``gradient_accumulation_steps`` (not mapped for it).
    """

    def __init__(self, learning_rate=0.001, learning_rate_power=-0.5, initial_accumulator_value=0.1,
                 l1_regularization_strength=0.0, l2_regularization_strength=0.0,
                 l2_shrinkage_regularization_strength=0.0, beta=0.0, **kwargs):
        self.learning_rate = learning_rate
        c = _common(kwargs)
        _no_accumulation(c, "Ftrl")
        self._finish(
            lambda rate, decay: [T.ftrl(rate, learning_rate_power, initial_accumulator_value, l1_regularization_strength,
                                        l2_regularization_strength, l2_shrinkage_regularization_strength, beta, decay)],
            None, **c, rate_inside=True,
            config=dict(learning_rate=learning_rate, learning_rate_power=learning_rate_power,
                        initial_accumulator_value=initial_accumulator_value,
                        l1_regularization_strength=l1_regularization_strength,
                        l2_regularization_strength=l2_regularization_strength,
                        l2_shrinkage_regularization_strength=l2_shrinkage_regularization_strength, beta=beta,
                        **{k: v for k, v in c.items() if v is not None}),
        )


def _no_accumulation(c, name):
    if c["gradient_accumulation_steps"] is not None:
        raise ValueError(f"tfnet does not map `gradient_accumulation_steps` for {name}. Received: "
                         f"gradient_accumulation_steps={c['gradient_accumulation_steps']}")


class ScheduleFreeAdamW(Method):
    """Schedule-free AdamW (Defazio et al., 2024; Keras 3 formula): no schedule needed, the weights an interpolation
    of Adam-stepped iterates and their running average, ``warmup_steps`` of linear warm-up. Defaults as Keras's:
    learning_rate 0.0025, beta_1 0.9, beta_2 0.999, epsilon 1e-8, warmup_steps 0.

    Raises:
        ValueError: ``gradient_accumulation_steps`` (not mapped for it).
    """

    def __init__(self, learning_rate=0.0025, beta_1=0.9, beta_2=0.999, epsilon=1e-8, warmup_steps=0, **kwargs):
        self.learning_rate = learning_rate
        c = _common(kwargs)
        _no_accumulation(c, "ScheduleFreeAdamW")
        self._finish(
            lambda rate, decay: [T.schedule_free_adamw(rate, beta_1, beta_2, epsilon, warmup_steps, decay)], None,
            **c, rate_inside=True,
            config=dict(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
                        warmup_steps=warmup_steps, **{k: v for k, v in c.items() if v is not None}),
        )


class Muon(Method):
    """Muon (Jordan et al., 2024; Keras 3 formula): each matrix's Nesterov momentum orthogonalised (Newton-Schulz),
    scaled by ``sqrt(max(rows, cols)) * rms_rate``; the other weights (not of rank 2, embeddings with
    ``exclude_embeddings``, names ``exclude_layers`` searches; or exactly ``adamw_weights``, a regular expression)
    take AdamW's step at ``learning_rate * adam_lr_ratio`` with ``adam_weight_decay``. Defaults as Keras's.

    Raises:
        ValueError: ``gradient_accumulation_steps`` (not mapped for it).
    """

    def __init__(self, learning_rate=0.001, adam_beta_1=0.9, adam_beta_2=0.999, adam_weight_decay=0.004,
                 epsilon=1e-7, weight_decay=0.004, exclude_layers=None, exclude_embeddings=True, muon_a=3.4445,
                 muon_b=-4.7750, muon_c=2.0315, adam_lr_ratio=1.0, momentum=0.95, ns_steps=5, nesterov=True,
                 rms_rate=0.2, adamw_weights=None, **kwargs):
        self.learning_rate = learning_rate
        c = _common({**kwargs, "weight_decay": weight_decay})
        _no_accumulation(c, "Muon")
        layers = [re.compile(p) for p in (exclude_layers or [])]
        chosen = re.compile(adamw_weights) if isinstance(adamw_weights, str) else adamw_weights

        def adamw(name, shape):  # Keras's _should_use_adamw, on tfnet's weight names (Keras's paths)
            if chosen is not None:
                return chosen.search(name) is not None
            return (shape.rank != 2 or (exclude_embeddings and "embedding" in name.lower())
                    or any(p.search(name) for p in layers))

        def rule(rate, decay):
            adam_decay = (adam_weight_decay, rate, decay[2]) if adam_weight_decay else None
            return [T.muon(rate, adamw, adam_beta_1, adam_beta_2, epsilon, adam_lr_ratio, momentum, ns_steps, nesterov,
                           rms_rate, (muon_a, muon_b, muon_c), decay, adam_decay)]

        self._finish(
            rule, None, **c, rate_inside=True,
            config=dict(learning_rate=learning_rate, adam_beta_1=adam_beta_1, adam_beta_2=adam_beta_2,
                        adam_weight_decay=adam_weight_decay, epsilon=epsilon, exclude_layers=exclude_layers,
                        exclude_embeddings=exclude_embeddings, muon_a=muon_a, muon_b=muon_b, muon_c=muon_c,
                        adam_lr_ratio=adam_lr_ratio, momentum=momentum, ns_steps=ns_steps, nesterov=nesterov,
                        rms_rate=rms_rate, **{k: v for k, v in c.items() if v is not None}),
        )


_NO_LARS = re.compile(r"(bias|beta|gamma|bn|batch_norm|BatchNorm)")


class LARS(Method):
    """Layer-wise adaptive rate scaling (You, Gitman and Ginsburg, 2017) for large-batch ResNet.

    For each weight ``w`` with gradient ``g``: ``g <- g + weight_decay * w``; then
    ``g <- g * trust_coefficient * ||w|| / ||g||`` (when both norms are positive); then SGD with
    momentum: ``m <- momentum * m - lr * g``, ``w <- w + m``. Biases and batch-norm parameters are
    left out of both the decay and the trust ratio (``exclude``), as is usual for ResNet. As a chain:
    ``add_decayed_weights``, ``scale_by_trust_ratio``, ``scale_by_learning_rate``, ``trace``.

    Args:
        learning_rate: Default 0.1.
        momentum: Default 0.9.
        weight_decay: L2 decay inside the trust ratio. Default 1e-4.
        trust_coefficient: ``eta``. Default 0.001.
        epsilon: Added to ``||g||``. Default 0.0.
        nesterov: Default False.
        exclude: A regex of weight names to leave unadapted and undecayed; ``None`` adapts all.
    """

    def __init__(self, learning_rate=0.1, momentum=0.9, weight_decay=1e-4, trust_coefficient=0.001, epsilon=0.0,
                 nesterov=False, exclude=_NO_LARS, **kwargs):
        self.learning_rate = learning_rate
        T.check_unit_interval("momentum", momentum, closed_right=True)
        pattern = re.compile(exclude) if isinstance(exclude, str) else exclude
        mask = None if pattern is None else (lambda name: pattern.search(name) is None)
        c = _common(kwargs)
        if c.pop("weight_decay") is not None:
            raise TypeError("LARS takes `weight_decay` as its own (coupled) decay; pass it once.")
        if c.pop("exclude_from_weight_decay") is not None:
            raise TypeError("LARS takes the weights it leaves out of its decay as `exclude`.")
        direction = [T.add_decayed_weights(weight_decay, mask), T.scale_by_trust_ratio(trust_coefficient, epsilon, mask)]
        self._finish(
            direction, T.trace(momentum, nesterov) if momentum else None, **c, weight_decay=None,
            config=dict(learning_rate=learning_rate, momentum=momentum, weight_decay=weight_decay,
                        trust_coefficient=trust_coefficient, epsilon=epsilon, nesterov=nesterov),
        )
