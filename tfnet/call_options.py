"""The options under which tfnet's compiled functions are instantiated: TensorFlow's graph optimiser (Grappler) less
the two passes that have nothing to do on a machine without GPUs.

Grappler optimises a function's graph when the function is first called, under the calling thread's function-call
options. Two of its default passes rewrite graphs for GPUs only: the layout optimiser (NHWC to NCHW for cuDNN; on a
CPU it converts nothing unless ``cpu_layout_conversion`` asks it to) and the memory optimiser (its default mode swaps
GPU tensors to the host). Each still copies and walks the whole graph: on NASNetMobile's gradient (about 5,000 nodes)
they took 1.1 of Grappler's 6.1 s and left the graph as they found it (docs/benchmarks.md). Where TensorFlow sees no
GPU, :func:`cpu_call_options` turns both off for the functions tfnet calls, in this thread's options only, on top of
whatever the process or the caller set: a user's own functions keep TensorFlow's defaults, and a machine with a GPU
keeps them everywhere. :func:`thread_rewrites` is the mechanism, which :func:`tfnet.precision.bf16_rewrite` uses too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["cpu_call_options", "edited_options", "thread_rewrites", "with_cpu_call_options"]


def edited_options(before, edit: Callable):
    """``before`` (a thread's ``FunctionCallOptions``) with ``edit`` applied to a copy of its Grappler rewrite
    options (a ``RewriterConfig``, changed in place)."""
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.eager import context  # the per-thread call options: no public API sets them

    config = config_pb2.ConfigProto()
    config.ParseFromString(before.config_proto_serialized)
    edit(config.graph_options.rewrite_options)
    return context.FunctionCallOptions(executor_type=before.executor_type, config_proto=config)


@contextmanager
def thread_rewrites(options: Callable) -> Iterator[None]:
    """Inside it, this thread's function-call options are ``options(before)``; ``before`` comes back after, also
    when the body raises. TensorFlow keeps these options per thread: a function this thread instantiates inside
    is optimised under them, and no other thread's are touched."""
    from tensorflow.python.eager import context

    ctx = context.context()
    before = ctx.function_call_options
    ctx.function_call_options = options(before)
    try:
        yield
    finally:
        ctx.function_call_options = before


@functools.cache
def _no_gpu() -> bool:
    import tensorflow as tf

    return not tf.config.list_physical_devices("GPU")


def _without_gpu_passes(rewrites) -> None:
    from tensorflow.core.protobuf import rewriter_config_pb2

    config = rewriter_config_pb2.RewriterConfig
    if rewrites.layout_optimizer == config.DEFAULT:
        rewrites.layout_optimizer = config.OFF
    if rewrites.memory_optimization == config.DEFAULT_MEM_OPT:
        rewrites.memory_optimization = config.NO_MEM_OPT


#: the options of a thread's calls, by the options it had before (their executor and serialised config)
_OPTIONS: dict[tuple[str | None, bytes], object] = {}


def _cpu_options(before):
    key = (before.executor_type, before.config_proto_serialized)
    found = _OPTIONS.get(key)
    if found is None:
        found = _OPTIONS[key] = edited_options(before, _without_gpu_passes)
    return found


@contextmanager
def cpu_call_options() -> Iterator[None]:
    """Inside it, the functions this thread instantiates skip Grappler's GPU-only passes (layout and memory), where
    TensorFlow sees no GPU and the options in force leave those passes at their defaults; elsewhere it changes
    nothing."""
    if not _no_gpu():
        yield
        return
    with thread_rewrites(_cpu_options):
        yield


def with_cpu_call_options(fn: Callable) -> Callable:
    """``fn`` (a ``tf.function``), each call under :func:`cpu_call_options`; its other attributes are ``fn``'s."""
    return _CpuCalls(fn)


class _CpuCalls:
    __slots__ = ("_fn",)

    def __init__(self, fn: Callable):
        self._fn = fn

    def __call__(self, *args, **kwargs):
        with cpu_call_options():
            return self._fn(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._fn, name)
