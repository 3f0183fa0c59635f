"""The Horovod collective: the training loop's peers are Horovod ranks over Gloo. Runs in each
rank's process; needs no Spark (:class:`HorovodSession` works in any process that has the
rendezvous environment).

Only Horovod's core collective ops are used (``grouped_allreduce``, ``allreduce``,
``broadcast``, ``allgather``); ``horovod.tensorflow.keras`` breaks with Keras 3. Horovod is imported with Keras left
unloaded (:func:`optim.horovod_import.import_horovod`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from optim.horovod_import import import_horovod
from optim.training.collective import Collective

log = logging.getLogger("tfnet.training")

# Settings that Horovod 0.28.1 "fixes" in its ParameterManager, which lives as long as the process
# (hvd.shutdown() does not reset it). The next hvd.init() in the same process then writes its default
# cycle time (1) into the slot of the tensor fusion threshold (ParameterManager::BayesianParameter::
# SetValue looks the fixed variable up with index_[variable], which inserts 0): that process fuses
# at 1 MiB and sizes its fusion buffer by 1 MiB while a fresh process uses 128 MiB. A reused Spark
# Python worker then overflows its fusion buffer when rank 0 sends a larger fused response (wrong
# averages or a segfault), or, with the response cache on, the ranks fuse differently and Gloo
# aborts. HOROVOD_AUTOTUNE makes ranks other than 0 fix every parameter the same way
# (Controller::SynchronizeParameters -> ParameterManager::SetParams). HorovodSession keeps both
# from hvd.init(), wherever they come from.
UNSAFE_ACROSS_INIT = ("HOROVOD_CYCLE_TIME", "HOROVOD_AUTOTUNE")


def horovod_env(rank: int, size: int, rendezvous_addr: str, rendezvous_port: int, iface: str | None,
                timeout_s: int, log_level: str | None = None) -> dict[str, str]:
    """Environment for ``hvd.init()`` with Gloo and the driver's rendezvous server.

    Each rank is its own host for Horovod (local size 1), which needs no knowledge of where Spark
    put the tasks; Gloo still connects every pair of ranks directly over TCP. ``log_level``: Horovod's
    ``HOROVOD_LOG_LEVEL`` (:func:`optim.launch.stage.horovod_log_level`), unless this process's environment
    has one. Horovod's C++ core reads it once per process, at the first line it logs (``hvd.init()``'s): a
    reused Python worker keeps the level of its first run.
    """
    env = {
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous_addr,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rendezvous_port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_HOSTNAME": f"rank{rank}",
        "HOROVOD_RANK": str(rank),
        "HOROVOD_SIZE": str(size),
        "HOROVOD_LOCAL_RANK": "0",
        "HOROVOD_LOCAL_SIZE": "1",
        "HOROVOD_CROSS_RANK": str(rank),
        "HOROVOD_CROSS_SIZE": str(size),
        # No response cache. It was turned off because a Python worker reused from an earlier
        # Horovod run made the next run fail with it on (Gloo: `op.preamble.length <= op.nbytes`).
        # The cause was HOROVOD_CYCLE_TIME, not the cache (UNSAFE_ACROSS_INIT above, which
        # HorovodSession now keeps from Horovod; docs/distributed.md, "Horovod's response cache"):
        # with the cache on each rank fuses cached tensors by its own threshold, which made the
        # broken threshold fail loudly. The cache would be safe now; it stays off because it saved
        # nothing measurable for 160 tensors of 100 MB on 2 ranks (docs/benchmarks.md).
        "HOROVOD_CACHE_CAPACITY": "0",
        "HOROVOD_GLOO_TIMEOUT_SECONDS": str(int(timeout_s)),
        # A rank that stops answering makes the others shut Horovod down instead of waiting.
        "HOROVOD_STALL_CHECK_TIME_SECONDS": str(max(5, int(timeout_s) // 2)),
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": str(int(timeout_s)),
    }
    if iface:
        env["HOROVOD_GLOO_IFACE"] = iface
    if log_level and not os.environ.get("HOROVOD_LOG_LEVEL"):
        env["HOROVOD_LOG_LEVEL"] = log_level
    return env


def buckets(tensors: Sequence, bucket_bytes: int) -> list[list[int]]:
    """Indices of ``tensors`` grouped into buckets of about ``bucket_bytes`` each, from the last
    tensor to the first (a backward pass makes the last layers' gradients first). ``0``: one bucket
    in the original order (a single grouped call after the whole backward pass)."""
    if not bucket_bytes:
        return [list(range(len(tensors)))] if len(tensors) else []
    out: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i in reversed(range(len(tensors))):
        t = tensors[i]
        current.append(i)
        size += int(np.prod(t.shape.as_list() if hasattr(t.shape, "as_list") else t.shape)) * t.dtype.size
        if size >= bucket_bytes:
            out.append(current)
            current, size = [], 0
    if current:
        out.append(current)
    return out


def average(hvd, tensors: list, compression: str | None, name: str) -> list:
    """Horovod's average of float tensors over the ranks (in a compiled step or eagerly).

    ``compression="fp16"`` sends float16 (Horovod's fp16 allreduce). ``"bf16"``: Horovod has no
    bfloat16 allreduce, so each rank's bfloat16 values (as 16-bit integers) are all-gathered and
    summed in float32 on every rank: the same sum everywhere, in float32's range."""
    if not tensors:
        return []
    if compression is None:
        return hvd.grouped_allreduce(tensors, op=hvd.Average, name=name)
    if compression == "fp16":
        half = [tf.cast(t, tf.float16) for t in tensors]
        return [tf.cast(r, t.dtype) for r, t in zip(hvd.grouped_allreduce(half, op=hvd.Average, name=name), tensors)]
    if compression != "bf16":
        raise ValueError(f"Unknown compression {compression!r}; expected None, 'fp16' or 'bf16'.")
    sizes = [tf.size(t) for t in tensors]
    flat = tf.concat([tf.reshape(tf.cast(t, tf.bfloat16), [-1]) for t in tensors], 0)
    gathered = hvd.allgather(tf.reshape(tf.bitcast(flat, tf.int16), [1, -1]), name=name)
    total = tf.reduce_sum(tf.cast(tf.bitcast(gathered, tf.bfloat16), tf.float32), axis=0)
    mean = total / tf.cast(tf.shape(gathered)[0], tf.float32)
    parts = tf.split(mean, tf.stack(sizes))
    return [tf.cast(tf.reshape(p, tf.shape(t)), t.dtype) for p, t in zip(parts, tensors)]


def exchange_bytes(nbytes: int, size: int, compression: str | None) -> int:
    """The bytes one rank sends to exchange ``nbytes`` of float32 values: a ring allreduce sends
    ``2 (N - 1) / N`` times the payload (reduce-scatter, then all-gather); fp16 halves the
    payload; bf16's all-gather sends the half-size payload ``N - 1`` times."""
    if size <= 1:
        return 0
    if compression == "bf16":
        return nbytes // 2 * (size - 1)
    payload = nbytes // 2 if compression == "fp16" else nbytes
    return payload * 2 * (size - 1) // size


class HorovodCollective(Collective):
    """Collectives over an initialised Horovod (``hvd.init()`` already called)."""

    def __init__(self):
        hvd = import_horovod()
        self.hvd = hvd
        self.rank = hvd.rank()
        self.size = hvd.size()
        self._reducers: dict = {}

    def reducer(self, bucket_bytes: int = 0, compression: str | None = None):
        """The step's gradient reducer: one grouped allreduce after the backward pass
        (``bucket_bytes=0``), or one per bucket of about ``bucket_bytes``, in reverse layer order,
        each free to start as soon as its gradients exist (``overlaps``); optionally in 16 bits.
        The same function for the same arguments, so the net's compiled-step cache finds it."""
        key = (int(bucket_bytes), compression)
        if key in self._reducers:
            return self._reducers[key]
        hvd = self.hvd

        def reduce(grads: dict, loss):
            names = list(grads)
            out = {}
            for i, bucket in enumerate(buckets([grads[n] for n in names], bucket_bytes)):
                part = [names[j] for j in bucket]
                out.update(zip(part, average(hvd, [grads[n] for n in part], compression, f"tfnet_grads_{i}")))
            loss = hvd.allreduce(loss, op=hvd.Average, name="tfnet_loss")
            return {n: out[n] for n in names}, loss

        reduce.overlaps = bool(bucket_bytes)
        self._reducers[key] = reduce
        return reduce

    def average(self, tensors: Sequence, compression: str | None = None, name: str = "tfnet_exchange") -> list:
        """The ranks' average of each tensor (float), eagerly: one grouped allreduce."""
        return average(self.hvd, list(tensors), compression, name)

    def allreduce_sum(self, array: np.ndarray) -> np.ndarray:
        t = tf.constant(np.asarray(array, np.float64))
        return self.hvd.allreduce(t, op=self.hvd.Sum).numpy()

    def _gather_ints(self, value: int) -> np.ndarray:
        return self.hvd.allgather(tf.constant([int(value)], tf.int64)).numpy()

    def allreduce_min(self, value: int) -> int:
        return int(self._gather_ints(value).min())

    def allreduce_max(self, value: int) -> int:
        return int(self._gather_ints(value).max())

    def broadcast(self, arrays: Sequence[np.ndarray], root: int = 0) -> list[np.ndarray]:
        """Broadcasts many arrays with one collective per dtype (packed into one buffer)."""
        arrays = [np.asarray(a) for a in arrays]
        out: list[np.ndarray | None] = [None] * len(arrays)
        by_dtype: dict[np.dtype, list[int]] = {}
        for i, a in enumerate(arrays):
            by_dtype.setdefault(a.dtype, []).append(i)
        for dtype, idx in sorted(by_dtype.items(), key=lambda kv: str(kv[0])):
            flat = np.concatenate([arrays[i].ravel() for i in idx]) if idx else np.zeros(0, dtype)
            got = self.hvd.broadcast(tf.constant(flat), root_rank=root, name=f"tfnet_bcast_{dtype}").numpy()
            pos = 0
            for i in idx:
                n = arrays[i].size
                out[i] = got[pos:pos + n].reshape(arrays[i].shape)
                pos += n
        return out  # type: ignore[return-value]


class HorovodSession:
    """Horovod initialised in this process with ``env``, until :meth:`close`.

    The variables in ``env`` are set for ``hvd.init()`` and restored to what they were (or
    removed) on close, after ``hvd.shutdown()``, so a reused Python worker starts its next task
    with the environment it had. :data:`UNSAFE_ACROSS_INIT`, in ``env`` or in the process
    environment, are kept from ``hvd.init()`` with a warning (and the process environment's values
    restored on close). Use as a context manager, or call :meth:`close` once.

    With ``threads="idle"`` (the default), the threads that ``hvd.init()`` starts (Horovod's
    background thread and Gloo's) run under ``SCHED_IDLE``: :mod:`optim.training.comm_threads`.

    Attributes:
        collective: The :class:`HorovodCollective` over the ranks.
        idle: The :class:`~optim.training.comm_threads.IdleRecord` of the threads ``hvd.init()``
            started and of those it put at idle priority (none with ``threads="normal"``).
    """

    def __init__(self, env: dict[str, str], on_close=None, threads: str = "idle"):
        hidden = [k for k in UNSAFE_ACROSS_INIT if k in env or os.environ.get(k)]
        if hidden:
            log.warning("Ignoring %s for Horovod: in a process that runs Horovod again (a reused Python worker) "
                        "it breaks the next run's tensor fusion (docs/distributed.md, \"Horovod's response cache\").",
                        ", ".join(hidden))
        env = {k: v for k, v in env.items() if k not in hidden}
        self._saved = {k: os.environ.get(k) for k in [*env, *hidden]}
        self._on_close = on_close
        self._closed = False
        for k in hidden:
            os.environ.pop(k, None)
        os.environ.update(env)
        try:
            from optim.training import comm_threads

            hvd = import_horovod()

            before = comm_threads.thread_ids()
            hvd.init()
            started = comm_threads.thread_ids() - before
            self.idle = comm_threads.IdleRecord(started, idle=threads == "idle")
            self.collective = HorovodCollective()
        except BaseException:
            self._restore()
            raise

    @property
    def idle_threads(self) -> list[int]:
        """The ids of the threads put at idle priority that are still alive (a Horovod or Gloo
        thread may end at any time; ``idle.demoted`` keeps the record made at ``hvd.init()``)."""
        return self.idle.live()

    def _restore(self) -> None:
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            import_horovod().shutdown()
        except Exception:  # noqa: BLE001 - best effort when tearing down after a failure
            pass
        finally:
            self._restore()
            if self._on_close is not None:
                self._on_close()

    def __enter__(self) -> HorovodSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
