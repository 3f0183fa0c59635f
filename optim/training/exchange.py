"""How a rank's steps meet the other ranks': one class per ``sync`` mode (:mod:`optim.sync`). Runs
in every rank's process (and in a local run, where the collective is the identity).

The training loop calls :meth:`Exchange.step` for each batch and :meth:`Exchange.settle` before
anything that needs one model on every rank (a checkpoint, a validation, the epoch's metric sums,
the end). Each exchange counts the bytes this rank sends (:attr:`Exchange.bytes_sent`).
"""

from __future__ import annotations

import collections
import concurrent.futures
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from optim.sync import Asynchronous, EveryStep, LocalSGD, check_sync
from optim.training.collective import Collective
from optim.training.horovod import exchange_bytes
from tfnet.step import StepResult

__all__ = ["Exchange", "EveryStepExchange", "LocalSGDExchange", "AsyncExchange", "make_exchange"]


def _nbytes(net, names: Sequence[str]) -> int:
    variables = net.weight_variables
    return sum(int(np.prod(variables[n].shape)) * variables[n].dtype.size for n in names)


def _gradient_bytes(net, size: int, compression: str | None) -> int:
    """What a rank sends to average one step's gradients (one per trainable weight) and its loss."""
    return exchange_bytes(_nbytes(net, net.trainable) + 4, size, compression)


class Exchange:
    """Every step on its own (one rank), and the interface of the modes."""

    #: The bytes this rank has sent to the others since the start of the call.
    bytes_sent: int = 0
    #: Whether each rank keeps a worker-method state of its own (local SGD), which a checkpoint then holds for every
    #: rank; else every rank holds rank 0's.
    per_rank_state: bool = False

    def __init__(self, net, collective: Collective):
        self.net, self.collective = net, collective
        self.bytes_sent = 0

    def reducer(self):
        """The reducer the compiled step runs (None: the step does not exchange)."""
        return None

    def start(self, step_fn) -> None:
        """Called once the weights and the optimiser state are where the run starts."""

    def step(self, step_fn, features, labels) -> StepResult:
        return step_fn.run(features, labels)

    def settle(self, step_fn) -> None:
        """Makes every rank hold the same weights (exchanges whatever is pending)."""

    def state(self) -> list[np.ndarray]:
        """State a checkpoint must hold beyond the worker method's (the server method's)."""
        return []

    def load_state(self, leaves: Sequence[np.ndarray]) -> None:
        """Continues from a checkpoint's :meth:`state`."""

    def fresh_state(self) -> list[np.ndarray]:
        """:meth:`state` as it starts (arrays of its shapes, to receive rank 0's)."""
        return []

    def close(self) -> None:
        """Stops any background work."""


class EveryStepExchange(Exchange):
    """The gradients averaged inside the compiled step (in buckets as the backward pass makes them
    with ``overlap``), every step."""

    def __init__(self, net, collective: Collective, mode: EveryStep):
        super().__init__(net, collective)
        self.mode = mode
        self.per_step = _gradient_bytes(net, collective.size, mode.compression)

    def reducer(self):
        if self.collective.size == 1:
            return None
        return self.collective.reducer(self.mode.bucket_bytes, self.mode.compression)

    def step(self, step_fn, features, labels) -> StepResult:
        result = step_fn.run(features, labels)
        self.bytes_sent += self.per_step
        return result


class LocalSGDExchange(Exchange):
    """``every`` local steps, then one averaging of the weights' moves, applied by the server
    method to the anchor (the weights at the last exchange)."""

    per_rank_state = True

    def __init__(self, net, collective: Collective, mode: LocalSGD):
        super().__init__(net, collective)
        self.every = mode.every
        self.server = mode.server_method()
        self.names = list(net.trainable)
        self.vars = net.weight_variables  # the net's variables by weight name (assigned in place)
        trainable = set(self.names)
        # statistics (batch-norm moments) move in the forward pass: averaged as they are
        self.stats = [n for n in net.statistic_names if n not in trainable and self.vars[n].dtype.is_floating]
        self.per_exchange = exchange_bytes(_nbytes(net, self.names + self.stats), collective.size, None)
        self.local_steps = 0
        self.anchor: dict[str, tf.Variable] = {}
        self.server_state = None
        # one compiled exchange: the moves, their average, the server's update, the new weights
        self._exchange_fn = tf.function(self._exchange_graph, autograph=False, reduce_retracing=True)

    def start(self, step_fn) -> None:
        """The anchor is where the run starts (the weights every rank now holds)."""
        for n in self.names:
            value = self.vars[n].value()
            if n in self.anchor:
                self.anchor[n].assign(value)
            else:
                with tf.init_scope():
                    self.anchor[n] = tf.Variable(value, trainable=False, name="tfnet_anchor")
        if self.server_state is None:
            self.server_state = self.server.init({n: v.value() for n, v in self.anchor.items()})
        self.local_steps = 0

    def step(self, step_fn, features, labels) -> StepResult:
        result = step_fn.run(features, labels)
        self.local_steps += 1
        if self.local_steps >= self.every:
            self._exchange()
        return result

    def settle(self, step_fn) -> None:
        if self.local_steps:
            self._exchange()

    def _exchange_graph(self, state):
        variables, names = self.vars, self.names
        anchor = {n: self.anchor[n].value() for n in names}
        moves = [anchor[n] - variables[n].value() for n in names]
        stats = [variables[n].value() for n in self.stats]
        averaged = self.collective.average(moves + stats, name="tfnet_local_sgd")
        pseudo = dict(zip(names, averaged[:len(names)]))
        updates, state = self.server.update(pseudo, state, anchor)
        for n in names:
            new = anchor[n] + tf.cast(updates[n], anchor[n].dtype)
            variables[n].assign(new)
            self.anchor[n].assign(new)
        for n, value in zip(self.stats, averaged[len(names):]):
            variables[n].assign(value)
        return state

    def _exchange(self) -> None:
        self.server_state = self._exchange_fn(self.server_state)
        self.bytes_sent += self.per_exchange
        self.local_steps = 0

    def state(self) -> list[np.ndarray]:
        return [np.array(t, copy=True) for t in tf.nest.flatten(self.server_state)]

    def _server_init(self):
        """The server method's state for the current weights (its structure and shapes)."""
        return self.server.init({n: self.vars[n].value() for n in self.names})

    def fresh_state(self) -> list[np.ndarray]:
        return [np.array(t) for t in tf.nest.flatten(self._server_init())]

    def load_state(self, leaves: Sequence[np.ndarray]) -> None:
        template = self._server_init()
        flat = tf.nest.flatten(template)
        if len(flat) != len(leaves):
            from optim.errors import CheckpointError

            raise CheckpointError(f"The checkpoint holds {len(leaves)} arrays of server-method state; this run's server "
                                  f"method {self.server!r} has {len(flat)}. Resume with the server method it was "
                                  "written with.")
        self.server_state = tf.nest.pack_sequence_as(
            template, [tf.constant(a, dtype=t.dtype) for a, t in zip(leaves, flat)])


class AsyncExchange(Exchange):
    """Each step's gradients averaged in a background thread while the next step computes; a step
    applies the average of the step ``staleness`` before it."""

    def __init__(self, net, collective: Collective, mode: Asynchronous):
        super().__init__(net, collective)
        self.staleness, self.compression = mode.staleness, mode.compression
        self.per_step = _gradient_bytes(net, collective.size, mode.compression)
        self.pending: collections.deque = collections.deque()
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tfnet-exchange")

    def _average(self, names: list[str], grads: list, loss):
        out = self.collective.average(grads + [tf.reshape(loss, [1])], self.compression, name="tfnet_async")
        return dict(zip(names, out[:-1])), tf.reshape(out[-1], [])

    def step(self, step_fn, features, labels) -> StepResult:
        loss, outs, grads = step_fn.gradients(features, labels)
        names = list(grads)
        self.pending.append(self.pool.submit(self._average, names, [grads[n] for n in names], loss))
        self.bytes_sent += self.per_step
        finite = tf.math.is_finite(loss)
        while len(self.pending) > self.staleness:
            finite = tf.logical_and(finite, self._apply_oldest(step_fn))
        return StepResult(loss, outs, None, finite)

    def _apply_oldest(self, step_fn):
        grads, loss = self.pending.popleft().result()
        return step_fn.apply_gradients(grads, loss)

    def settle(self, step_fn) -> None:
        finite = True
        while self.pending:
            finite = bool(self._apply_oldest(step_fn)) and finite
        if not finite:
            import warnings

            warnings.warn("A pending averaged gradient was not finite and was not applied.", RuntimeWarning,
                          stacklevel=3)

    def close(self) -> None:
        for f in self.pending:
            f.cancel()
        self.pending.clear()
        # an exchange stuck on a dead rank ends when Horovod shuts down; do not wait for it here
        self.pool.shutdown(wait=False, cancel_futures=True)


def make_exchange(sync, net, collective: Collective) -> Exchange:
    """The exchange for ``sync`` (None: every step)."""
    mode = check_sync(sync)
    if isinstance(mode, LocalSGD):
        return LocalSGDExchange(net, collective, mode)
    if isinstance(mode, Asynchronous):
        return AsyncExchange(net, collective, mode)
    return EveryStepExchange(net, collective, mode)
