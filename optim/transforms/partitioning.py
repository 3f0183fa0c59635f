"""Per-group transforms: weights matched by name prefix or regex, each group its own transform."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import tensorflow as tf

from optim.errors import OptimizerStateError
from optim.transforms.base import EmptyState, GradientTransformation, Params

__all__ = ["PartitionState", "matcher", "assign_groups", "partition"]


class PartitionState(NamedTuple):
    inner: tuple


def matcher(key) -> Callable[[str], bool]:
    """A group key: a compiled regex (``re.search``), or a string prefix."""
    if isinstance(key, re.Pattern):
        return lambda name: key.search(name) is not None
    if isinstance(key, str):
        return lambda name: name.startswith(key)
    raise TypeError(f"Group keys are name prefixes (str) or compiled regexes. Received: {key!r}")


def assign_groups(keys: Sequence, names: Sequence[str]) -> dict[str, int | None]:
    """Each name's group: the index of the first key that matches it, or None."""
    tests = [matcher(k) for k in keys]
    return {name: next((i for i, t in enumerate(tests) if t(name)), None) for name in names}


def partition(groups: Mapping[Any, GradientTransformation | None]) -> GradientTransformation:
    """Per-group transforms: ``{prefix_or_regex: transform}``. A weight takes the first group whose
    key matches it; a weight matching no group, or a group whose transform is ``None``, is frozen
    (zero updates).

    Example:
        >>> import re
        >>> from optim import transforms as T
        >>> t = T.partition({"head/": T.scale_by_learning_rate(0.1), re.compile("bn"): None})
        >>> updates, _ = t.update({"head/w": tf.ones([2]), "body/bn": tf.ones([2])},
        ...                       t.init({"head/w": tf.ones([2]), "body/bn": tf.ones([2])}))
        >>> [float(updates["head/w"][0]), float(updates["body/bn"][0])]
        [-0.10000000149011612, 0.0]
    """
    keys = list(groups)
    transforms = [groups[k] for k in keys]

    def split(tree: Params, names: Sequence[str]):
        assignment = assign_groups(keys, names)
        return [{n: tree[n] for n in names if assignment[n] == i} for i in range(len(keys))]

    def init(params):
        parts = split(params, list(params))
        return PartitionState(tuple(
            t.init(p) if t is not None else EmptyState() for t, p in zip(transforms, parts)
        ))

    def update(grads, state, params=None):
        if not isinstance(state, PartitionState) or len(state.inner) != len(keys):
            got = f"{len(state.inner)} groups" if isinstance(state, PartitionState) else type(state).__name__
            raise OptimizerStateError(
                f"This partition has {len(keys)} groups ({keys}) and expects a PartitionState of {len(keys)}; "
                f"received {got}. The state was made by another optimiser; start from this one's init()."
            )
        names = list(grads)
        g_parts = split(grads, names)
        p_parts = split(params, names) if params is not None else [None] * len(keys)
        updates = {n: tf.zeros_like(g) for n, g in grads.items()}
        new_inner = []
        for t, g, p, s in zip(transforms, g_parts, p_parts, state.inner):
            if t is None or not g:
                new_inner.append(s)
                continue
            u, s = t.update(g, s, p)
            updates.update(u)
            new_inner.append(s)
        return updates, PartitionState(tuple(new_inner))

    return GradientTransformation(init, update)
