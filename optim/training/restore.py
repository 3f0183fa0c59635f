"""What a run saves in and restores from a checkpoint: the weights it holds (a net with low-rank
adapters: the adapters and the trainable weights, with the fingerprint of the frozen base they belong
to), the weights matched to the net (by name, else by structure), the server method's state split
from the worker method's, and the optimiser state checked against the step's; and the weights a run ends with where its
method keeps them in its state (``use_ema``). Beside :mod:`optim.training.checkpoint`, which reads and writes the
files."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import warnings
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from optim.errors import CheckpointError, CheckpointWarning
from optim.training.checkpoint import Checkpoint
from tfnet.lora import carried_weight_names, fingerprint

__all__ = ["BASE_KEY", "PEERS_KEY", "base_record", "check_state", "fits", "load_state", "match_weights", "saved_weights",
           "split_exchange_state", "state_arrays", "state_digest"]

#: A checkpoint's ``extra`` entry for a net with adapters: ``{"sha256": the fingerprint of the weights
#: it leaves out (the frozen base), "count": how many they are}``.
BASE_KEY = "base_weights"


def saved_weights(net, cache: dict) -> tuple[dict[str, np.ndarray], dict]:
    """``(weights, extra entries)`` for a checkpoint of ``net``: every weight of a plain net; for a net
    with adapters (:meth:`tfnet.TFNet.with_lora`), the adapters and the trainable weights, and under
    :data:`BASE_KEY` the fingerprint of the rest, which training cannot change. ``cache`` (a dict
    kept for the run) holds that fingerprint after the first call: it is computed once."""
    names = carried_weight_names(net)
    if len(names) == len(net.weight_names):
        return net.get_weights(), {}
    if "base" not in cache:
        cache["base"] = base_record(net, names)
    return net.get_weights(names), {BASE_KEY: dict(cache["base"])}


def base_record(net, carried) -> dict:
    """``{"sha256", "count"}`` of the weights of ``net`` that are not in ``carried``, in the net's order."""
    carried = set(carried)
    variables = net.weight_variables
    left = {n: variables[n].numpy() for n in net.weight_names if n not in carried}
    return {"sha256": fingerprint(left), "count": len(left)}


def match_weights(ckpt: Checkpoint, net) -> list[np.ndarray]:
    """The checkpoint's weights in the net's order: by name, or, when the names differ (a Keras
    model rebuilt in the same process is named ``sequential_5/...`` instead of ``sequential_4/...``),
    by order and shape, as Keras's ``load_weights`` matches, with a warning that says so.

    A checkpoint of a net with adapters holds only some weights (:func:`saved_weights`): the rest come
    from the net, once their fingerprint matches the checkpoint's.

    Raises:
        CheckpointError: neither the names nor the structure (count, order and shapes) match; or
            the checkpoint's adapters belong to other base weights than the net's.
    """
    base = ckpt.extra.get(BASE_KEY)
    if base is not None:
        return _match_adapted(ckpt, net, base)
    names = net.weight_names
    if all(n in ckpt.weights for n in names):
        return [ckpt.weights[n] for n in names]
    theirs = list(ckpt.weights)
    shapes = [tuple(v.shape) for v in net.weight_variables.values()]
    if len(theirs) == len(names) and all(tuple(np.shape(ckpt.weights[t])) == s for t, s in zip(theirs, shapes)):
        renamed = [(t, n) for t, n in zip(theirs, names) if t != n]
        warnings.warn(
            f"Checkpoint {ckpt.path} names {len(renamed)} of its {len(names)} weights differently from this net "
            f"(e.g. {renamed[0][0]!r} for {renamed[0][1]!r}); they were matched by order and shape, as Keras's "
            "load_weights does.", CheckpointWarning, stacklevel=4)
        return [ckpt.weights[t] for t in theirs]
    missing = [n for n in names if n not in ckpt.weights]
    raise CheckpointError(
        f"Checkpoint {ckpt.path} does not hold weights {missing[:5]} of this net, and its structure differs too "
        f"({len(theirs)} weights, this net has {len(names)}; or their shapes differ); it was written for another "
        "model. Use another model_dir or resume=False."
    )


def _match_adapted(ckpt: Checkpoint, net, base: dict) -> list[np.ndarray]:
    names = net.weight_names
    foreign = [n for n in ckpt.weights if n not in names]
    if foreign:
        raise CheckpointError(
            f"Checkpoint {ckpt.path} holds weights {foreign[:5]} that this net does not have; it was written for "
            f"a net with other adapters (this one has {len(net.adapters)}: {list(net.adapters)[:5]}). Build the net "
            "with the same with_lora(...), or use another model_dir or resume=False."
        )
    mine = base_record(net, ckpt.weights)
    if mine["sha256"] != base["sha256"]:
        raise CheckpointError(
            f"Checkpoint {ckpt.path} holds adapters trained on base weights of fingerprint {base['sha256']} "
            f"({base.get('count')} weights), but this net's base weights have fingerprint {mine['sha256']} "
            f"({mine['count']} weights): they belong to another base model. Resume onto the base they were trained "
            "on, or use another model_dir or resume=False."
        )
    current = net.weight_variables
    return [ckpt.weights[n] if n in ckpt.weights else current[n].numpy() for n in names]


#: A checkpoint's ``extra`` entry for local SGD on several ranks, where each rank keeps a worker-method state of its
#: own: how many other ranks' states follow the server method's (ranks 1, 2, ...; each as many arrays as rank 0's).
PEERS_KEY = "peer_states"


def split_exchange_state(ckpt: Checkpoint) -> tuple[Checkpoint, list, list[list]]:
    """The checkpoint with rank 0's worker-method state only; the server method's state that follows it (local
    SGD; ``extra["exchange_state"]`` arrays); and the other ranks' worker-method states after that
    (``extra[PEERS_KEY]`` of them)."""
    n, k = int(ckpt.extra.get("exchange_state", 0)), int(ckpt.extra.get(PEERS_KEY, 0))
    state = list(ckpt.state)
    leaves = (len(state) - n) // (k + 1)
    rest = state[leaves + n:]
    peers = [rest[i * leaves:(i + 1) * leaves] for i in range(k)]
    return dataclasses.replace(ckpt, state=state[:leaves]), state[leaves:leaves + n], peers


def check_state(ckpt: Checkpoint, net, template) -> None:
    leaves = tf.nest.flatten(template)
    if len(leaves) != len(ckpt.state) or any(
        tuple(np.shape(a)) != tuple(t.shape) for a, t in zip(ckpt.state, leaves)
    ):
        raise CheckpointError(
            f"Checkpoint {ckpt.path} holds optimiser state of another shape ({len(ckpt.state)} arrays, this "
            f"optimiser has {len(leaves)}); it was written with another optimiser or trainable set."
        )


def state_arrays(step_fn) -> list[np.ndarray]:
    """Copies of the optimiser state's leaves (the variables keep changing in place)."""
    return [np.array(t, copy=True) for t in tf.nest.flatten(step_fn.get_state())]


def fits(leaves: Sequence[np.ndarray], template) -> bool:
    flat = tf.nest.flatten(template)
    return len(leaves) == len(flat) and all(tuple(np.shape(a)) == tuple(t.shape) for a, t in zip(leaves, flat))


def load_state(step_fn, leaves: Sequence[np.ndarray], template) -> None:
    step_fn.set_state(tf.nest.pack_sequence_as(
        template, [tf.constant(a, dtype=t.dtype) for a, t in zip(leaves, tf.nest.flatten(template))]
    ))


def state_digest(arrays: Sequence[np.ndarray]) -> str:
    """SHA-256 over ``arrays`` in order: each one's dtype, shape and bytes. Of a resumed run's start (the weights a
    checkpoint holds, in the net's order, then the optimiser's and the server method's state), it equals the
    same digest of that checkpoint's weights and state exactly when the run starts from them bit for bit."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def resumed_noise(net, steps: int) -> None:
    """A run resumed ``steps`` past where it started: the net's dropout and noise layers go on drawing from there
    (:mod:`tfnet.keras_training`), as the interrupted attempt would have."""
    if net.state.seed_step is not None and steps > 0:
        net.state.seed_step.assign_add(steps)


def final_weights(net, method, state) -> None:
    """Gives ``net`` the weights training ends with where the method says (``use_ema``: the moving average in its
    state), as Keras's ``fit`` calls ``finalize_variable_values`` before ``on_train_end``; every rank holds the same
    state (every-step sync), so every rank's net ends the same. ``state``: a function giving the optimiser state,
    asked only for such a method (a snapshot copies all of it)."""
    if not getattr(method, "use_ema", False):
        return
    weights = method.final_weights(state())
    if weights:
        net.set_weights({k: np.asarray(v) for k, v in weights.items()})


@contextlib.contextmanager
def moving_average_in(net, method, state):
    """The net holds ``use_ema``'s moving average inside the block and its own weights again after it, as Keras's
    ``SwapEMAWeights`` swaps them around validation; nothing where ``method`` is None or keeps no average. ``state``:
    a function giving the optimiser state (every rank's is the same: every-step sync)."""
    if method is None or not getattr(method, "use_ema", False):
        yield
        return
    own = net.get_weights()
    net.set_weights({k: np.asarray(v) for k, v in method.final_weights(state()).items()})
    try:
        yield
    finally:
        net.set_weights(own)
