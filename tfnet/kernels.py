"""2-D convolutions in the forms whose gradients every x86-64 CPU computes right, oneDNN on or off.

TensorFlow 2.21 picks its CPU kernels by CPU and by ``TF_ENABLE_ONEDNN_OPTS``, and two forms of ``Conv2D`` fail on
some of them (measured against float64, docs/benchmarks.md, "Kernels on every CPU"):

* **A 1x1 kernel with a stride above 1.** With oneDNN on and only AVX2 (AMD Zen 3; on any CPU with
  ``ONEDNN_MAX_CPU_ISA=AVX2``), oneDNN's filter gradient is 0.2 to 1.2 (relative) off when the input has fewer than
  8 channels (for example 2x8x8x4 to 8 channels, stride 2: ResNet's downsample in a small net), in a
  ``tf.function`` and eagerly; the forward pass is right, and so are the same shapes with AVX-512. It also writes
  outside its buffers: at one intra-op thread (a Spark task with one core) the process aborts ("malloc(): unaligned
  tcache chunk detected", "double free or corruption"), so tfnet never runs it there, not even to check it. The same
  kernel over every s-th pixel with stride 1 is the same convolution, exactly: where oneDNN runs its AVX2 kernels,
  or this process's kernel gets that shape's gradient wrong (:func:`strided_1x1_routed`, measured once against
  float64), :func:`conv2d` slices first. Elsewhere the convolution runs as it is: the view costs ResNet-50's
  fine-tuning step 4-6% in fp32 and 6-12% in bf16 on an AVX-512 CPU (docs/benchmarks.md, "The strided view only
  where a kernel needs it").
* **A dilation above 1.** TensorFlow's own ``Conv2DBackpropFilter`` ("Current CPU implementations do not yet
  support dilation rates larger than 1"), the kernel that runs with oneDNN off and on AVX2-only CPUs, has none.
  :func:`conv2d` runs a dilated convolution through space-to-batch, as ``tf.nn.convolution`` does.

Every other form goes to ``Conv2D`` as it is. :func:`self_check` checks the forms once per process before training
(``optim``'s loop calls it), so a CPU whose kernels are wrong in a way not known here stops with an error instead of
training silently wrong. :func:`rewrite_graph` does the first of these to the graphs tfnet
loads (a Keras model's, a TF1 checkpoint's), where the convolutions are single ops already, and splits the grouped
convolutions no CPU kernel differentiates per group.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2, types_pb2
from tensorflow.python.framework import tensor_util

from tfnet.errors import KernelCheckError
from tfnet.graph_utils import tensor_name
from tfnet.precision import cpu_flags, onednn_enabled, onednn_isa_cap

__all__ = ["conv2d", "raw_strided_1x1_error", "rewrite_graph", "self_check", "strided_1x1_routed"]

log = logging.getLogger("tfnet.kernels")


def conv2d(x: tf.Tensor, kernel: tf.Tensor, strides, dilations, padding) -> tf.Tensor:
    """``Conv2D`` of NHWC ``x`` with HWIO ``kernel``.

    Args:
        x: the input, NHWC.
        kernel: the filter, HWIO.
        strides: the two spatial strides.
        dilations: the two spatial dilations.
        padding: ``"SAME"``, ``"VALID"``, or explicit ``[[0, 0], [top, bottom], [left, right], [0, 0]]``.

    Returns:
        The same values as ``tf.raw_ops.Conv2D`` with these arguments, in a form whose gradients are right on
        every x86-64 CPU (see the module's docstring).
    """
    strides, dilations = [int(s) for s in strides], [int(d) for d in dilations]
    one_by_one = kernel.shape[0] == 1 and kernel.shape[1] == 1
    if one_by_one and strides != [1, 1] and strided_1x1_routed():
        if isinstance(padding, list):
            x = tf.pad(x, padding)
        # a 1x1 window needs no padding for SAME: its stride-s output reads every s-th pixel from the first
        return _raw(x[:, ::strides[0], ::strides[1], :], kernel, [1, 1], [1, 1], "VALID")
    if dilations == [1, 1] or one_by_one:
        return _raw(x, kernel, strides, [1, 1], padding)
    if padding == "SAME" and strides != [1, 1]:  # SAME's padding at stride s, then a stride-1 convolution
        padding = _same_padding(x, kernel, strides, dilations)
    if not isinstance(padding, str):  # explicit, given or computed: padded here, then VALID
        x, padding = tf.pad(x, padding), "VALID"
    y = tf.nn.convolution(x, kernel, padding=padding, dilations=dilations, data_format="NHWC")
    return y if strides == [1, 1] else y[:, ::strides[0], ::strides[1], :]


def _raw(x, kernel, strides, dilations, padding):
    kwargs = ({"explicit_paddings": [p for pair in padding for p in pair], "padding": "EXPLICIT"}
              if isinstance(padding, list) else {"padding": padding})
    return tf.raw_ops.Conv2D(input=x, filter=kernel, strides=[1, *strides, 1], dilations=[1, *dilations, 1],
                             data_format="NHWC", **kwargs)


def _same_padding(x, kernel, strides, dilations) -> tf.Tensor:
    """The ``[4, 2]`` paddings of SAME at ``strides`` (TensorFlow's rule), computed from ``x``'s shape at run time."""
    size = tf.shape(x)[1:3]
    s = tf.constant(strides)
    window = tf.constant([(k - 1) * d + 1 for k, d in zip(kernel.shape.as_list()[:2], dilations)])
    total = tf.maximum((size + s - 1) // s * s - s + window - size, 0)
    before = total // 2
    spatial = tf.stack([before, total - before], axis=1)
    zeros = tf.zeros([1, 2], tf.int32)
    return tf.concat([zeros, spatial, zeros], axis=0)


def rewrite_graph(graph_def: graph_pb2.GraphDef, graph: tf.Graph) -> tuple[graph_pb2.GraphDef, int]:
    """``graph_def`` with the convolution forms some CPUs get wrong rewritten, and how many it rewrote:

    * where this process's kernel differentiates it wrong (:func:`strided_1x1_routed`), each NHWC ``Conv2D`` of a 1x1
      kernel and a stride above 1 (SAME or VALID) reads a strided view of its input at stride 1, as :func:`conv2d`
      runs it;
    * each grouped ``Conv3D`` (a filter with fewer input channels than its input: Keras's ``groups=``), and each
      grouped ``Conv2D`` where oneDNN is off, runs as one convolution per group, concatenated: TensorFlow's CPU
      kernels have no grouped ``Conv3D``, and without oneDNN no gradient of a grouped ``Conv2D``.

    The graph of a Keras model or a TF1 checkpoint holds such convolutions as single ops. ``graph`` is the graph
    before batch-norm folding imported (``name=""``), for static shapes; a convolution it lacks (one that folding
    made) is looked up in ``graph_def`` imported here. Like batch-norm folding (tfnet.fold), this changes the graph
    that runs, never the graph that is saved."""
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    shapes = _Shapes(graph, graph_def)
    # oneDNN differentiates a grouped Conv2D on every CPU (AVX2 included); TensorFlow's own kernel has no gradient for
    # it ("Gradients for grouped convolutions are not supported on CPU"). Split only then: a depthwise convolution
    # written as Conv2D(groups=channels), as ConvNeXt's, would become hundreds of convolutions.
    split_grouped_conv2d = not onednn_enabled()
    taken = {n.name for n in out.node}
    added: list = []
    count = 0
    views: dict[tuple[str, tuple[int, ...]], str] = {}  # (input, strides) -> its view, for every conv that reads it
    for node in list(out.node):
        if node.op == "Conv2D" and _strided_one_by_one(node, shapes) and strided_1x1_routed():
            key = (tensor_name(node.input[0]), tuple(node.attr["strides"].list.i))  # "x" and "x:0" are one input
            if key not in views:
                views[key] = _free(f"{node.name}/tfnet_strided_view", taken)
                added.extend(_strided_view(node, views[key]))
            _read_view(node, views[key])
            count += 1
        if node.op == "Conv3D" or (node.op == "Conv2D" and split_grouped_conv2d):
            groups = _groups(node, shapes)
            if groups > 1:
                added.extend(_split_groups(node, groups, _free(f"{node.name}/tfnet_groups", taken)))
                count += 1
    out.node.extend(added)
    return out, count


class _Shapes:
    """Static shapes of the ops of ``graph``, falling back on ``graph_def`` imported once for an op ``graph`` lacks."""

    def __init__(self, graph: tf.Graph, graph_def: graph_pb2.GraphDef):
        self.graph, self.graph_def, self.own = graph, graph_def, None

    def inputs(self, name: str) -> list[tf.TensorShape]:
        try:
            op = self.graph.get_operation_by_name(name)
        except KeyError:  # a convolution that folding made (tfnet.fold)
            if self.own is None:
                self.own = tf.Graph()
                with self.own.as_default():
                    tf.graph_util.import_graph_def(self.graph_def, name="")
            op = self.own.get_operation_by_name(name)
        return [t.shape for t in op.inputs]


def _free(prefix: str, taken: set[str]) -> str:
    while any(n == prefix or n.startswith(prefix + "/") for n in taken):
        prefix += "_"
    taken.add(prefix)
    return prefix


def _const(name: str, value, dtype=tf.int32) -> node_def_pb2.NodeDef:
    return node_def_pb2.NodeDef(
        name=name, op="Const",
        attr={"dtype": attr_value_pb2.AttrValue(type=dtype.as_datatype_enum),
              "value": attr_value_pb2.AttrValue(tensor=tensor_util.make_tensor_proto(value, dtype))})


def _strided_one_by_one(node, shapes: _Shapes) -> bool:
    strides = list(node.attr["strides"].list.i)
    if (strides[1:3] == [1, 1] or node.attr["data_format"].s not in (b"", b"NHWC")
            or node.attr["padding"].s not in (b"SAME", b"VALID")):
        return False
    kernel = shapes.inputs(node.name)[1]
    return kernel.rank == 4 and kernel[0] == 1 and kernel[1] == 1


def _strided_view(node, prefix: str) -> list:
    """The nodes of ``x[:, ::s, ::s, :]``, named ``prefix``, for ``node`` (a strided 1x1 ``Conv2D`` of ``x``) to read
    at stride 1 (:func:`_read_view`). One view serves every such convolution of ``x`` (a ResNet block's shortcut and
    first convolution): their gradients add up at the view's size and go through one ``StridedSliceGrad``, instead of
    one each at the input's size, added there."""
    strides = list(node.attr["strides"].list.i)
    consts = [_const(f"{prefix}/{part}", value) for part, value in
              (("begin", [0] * 4), ("end", [0] * 4), ("strides", strides))]
    view = node_def_pb2.NodeDef(name=prefix, op="StridedSlice", input=[node.input[0]] + [c.name for c in consts])
    view.attr["T"].CopyFrom(node.attr["T"])
    view.attr["Index"].type = types_pb2.DT_INT32
    view.attr["begin_mask"].i = view.attr["end_mask"].i = 15
    view.device = node.device
    return [*consts, view]


def _read_view(node, view: str) -> None:
    """``node`` (a strided 1x1 ``Conv2D``) reads ``view`` (:func:`_strided_view`) at stride 1 instead of its input."""
    node.input[0] = view
    node.attr["strides"].list.i[:] = [1, 1, 1, 1]
    node.attr["padding"].s = b"VALID"


def _groups(node, shapes: _Shapes) -> int:
    if node.attr["data_format"].s not in (b"", b"NHWC", b"NDHWC"):
        return 1
    x, kernel = shapes.inputs(node.name)[:2]
    channels, per_group = x[-1] if x.rank else None, kernel[-2] if kernel.rank else None
    if channels is None or per_group is None or channels == per_group or channels % per_group:
        return 1
    return channels // per_group


def _split_groups(node, groups: int, prefix: str) -> list:
    """``node`` (a grouped convolution) becomes the concatenation of one convolution per group, under its own name
    (its readers are unchanged); returns the nodes that adds."""
    axis = _const(f"{prefix}/axis", -1)
    parts = []
    for what, source in (("x", node.input[0]), ("filter", node.input[1])):
        split = node_def_pb2.NodeDef(name=f"{prefix}/{what}", op="Split", input=[axis.name, source])
        split.attr["T"].CopyFrom(node.attr["T"])
        split.attr["num_split"].i = groups
        split.device = node.device
        parts.append(split)
    controls = [i for i in node.input if i.startswith("^")]
    convs = []
    for g in range(groups):
        conv = node_def_pb2.NodeDef()
        conv.CopyFrom(node)
        conv.name = f"{prefix}/group_{g}"
        conv.input[:] = [f"{prefix}/x:{g}", f"{prefix}/filter:{g}", *controls]
        convs.append(conv)
    name, dtype = node.name, attr_value_pb2.AttrValue()
    dtype.CopyFrom(node.attr["T"])
    node.Clear()
    node.name, node.op = name, "ConcatV2"
    node.input.extend([c.name for c in convs] + [axis.name])
    node.attr["T"].CopyFrom(dtype)
    node.attr["N"].i = groups
    node.attr["Tidx"].type = types_pb2.DT_INT32
    node.device = convs[0].device
    return [axis, *parts, *convs]


@functools.lru_cache(maxsize=1)
def raw_strided_1x1_error() -> float:
    """Once per process: the relative error, against float64, of this CPU's filter gradient of a raw strided 1x1
    ``Conv2D`` in the shape that came out wrong (2x8x8x4 to 8 channels, stride 2; the worst of a few runs).

    Raises:
        RuntimeError: oneDNN runs its AVX2 kernels here (:func:`strided_1x1_routed` is True without asking): that
            kernel writes outside its buffers, and at one intra-op thread the process aborts."""
    if _onednn_below_avx512():
        raise RuntimeError("TensorFlow's strided 1x1 filter gradient is not run where oneDNN runs its AVX2 kernels: "
                           "it writes outside its buffers (tfnet.kernels)")
    rng = np.random.default_rng(0)
    x, w, gy = rng.standard_normal((2, 8, 8, 4)), rng.standard_normal((1, 1, 4, 8)), rng.standard_normal((2, 4, 4, 8))
    # in a thread of its own: eager and with no tape recording, also when first asked while a tf.function is traced
    # (conv2d in an ONNX graph; tf.init_scope would pause the check's own tape too)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(_relative_error, _raw_strided, _raw_strided, x, w, gy).result()


@functools.lru_cache(maxsize=1)
def strided_1x1_routed() -> bool:
    """Once per process: whether :func:`conv2d` and :func:`rewrite_graph` run strided 1x1 convolutions over a strided
    view: where oneDNN runs its AVX2 kernels (the CPU has no AVX-512, or ``ONEDNN_MAX_CPU_ISA`` stops below it: the
    kernels found wrong, which were right now and then), and wherever this CPU's kernel gets the gradient wrong
    (:func:`raw_strided_1x1_error`). Said once, in the log, where the view is taken."""
    if _onednn_below_avx512():
        log.info("oneDNN runs its AVX2 kernels here, whose filter gradient of a strided 1x1 convolution was found "
                 "wrong; tfnet runs such convolutions over a strided view at stride 1, which is right.")
        return True
    error = raw_strided_1x1_error()
    if error >= _RIGHT:
        log.info("This CPU's filter gradient of a strided 1x1 convolution is %.2g off float64; tfnet runs such "
                 "convolutions over a strided view at stride 1, which is right.", error)
        return True
    return False


_RIGHT = 1e-4  # a kernel's gradient within this of float64 (relative) is right: float32 gives about 1e-7
#: ``ONEDNN_MAX_CPU_ISA`` values below AVX-512 (oneDNN's names, any case; ``DNNL_MAX_CPU_ISA`` is its older name)
_BELOW_AVX512 = {"sse41", "avx", "avx2", "avx2_vnni", "avx2_vnni_2"}


def _onednn_below_avx512() -> bool:
    if not onednn_enabled():
        return False
    return "avx512f" not in cpu_flags() or onednn_isa_cap() in _BELOW_AVX512


def _raw_strided(a, w):
    return _raw(a, w, [2, 2], [1, 1], "VALID")


def _relative_error(f, reference, x, w, gy) -> float:
    """The worst relative error of ``f``'s filter gradient in float32 against ``reference``'s in float64, over a few
    runs (the wrong kernel found so far gave a right answer now and then: memory it reuses)."""
    want = _filter_gradient(reference, x, w, gy, tf.float64)
    runs = [_filter_gradient(f, x, w, gy, tf.float32) for _ in range(_RUNS)]
    return max(float(np.abs(got - want).max() / np.abs(want).max()) for got in runs)


@functools.lru_cache(maxsize=1)
def self_check() -> dict[str, float]:
    """Once per process: the convolution gradients this module's forms give on this CPU, against float64. Returns
    the relative error of each form checked (``strided_1x1``, ``dilated``, and ``raw_strided_1x1``: TensorFlow's own
    kernel for what :func:`conv2d` routes around, for the record, left out where oneDNN runs its AVX2 kernels: that
    kernel is the wrong one there, and running it corrupts the process's memory).

    Raises:
        KernelCheckError: one of tfnet's own forms is wrong here (a kernel this module does not know of yet).
    """
    rng = np.random.default_rng(0)
    x, gy = rng.standard_normal((2, 8, 8, 4)), rng.standard_normal((2, 4, 4, 8))
    # the references: float64 (never oneDNN's), undilated (a dilated kernel is the kernel with zeros between taps)
    cases = {
        "strided_1x1": (rng.standard_normal((1, 1, 4, 8)), lambda a, w: conv2d(a, w, [2, 2], [1, 1], "VALID"),
                        _raw_strided, gy),
        "dilated": (rng.standard_normal((3, 3, 4, 8)), lambda a, w: conv2d(a, w, [1, 1], [2, 2], "SAME"),
                    lambda a, w: _raw(a, _dilated(w, 2), [1, 1], [1, 1], "SAME"), rng.standard_normal((2, 8, 8, 8))),
    }
    # TensorFlow's own kernel for the record, only where it may be right: where oneDNN runs its AVX2 kernels it is
    # the wrong one, which writes outside its buffers (it aborts the process at one thread)
    errors = {} if _onednn_below_avx512() else {"raw_strided_1x1": raw_strided_1x1_error()}
    failed = {}
    for name, (w, f, reference, g) in cases.items():
        try:
            errors[name] = _relative_error(f, reference, x, w, g)
        except tf.errors.OpError as exc:  # no kernel for the form here ("do not yet support dilation rates")
            errors[name], failed[name] = float("inf"), exc.message.strip().splitlines()[0][:200]
    wrong = {k: failed.get(k, v) for k, v in errors.items() if not k.startswith("raw") and not v < _RIGHT}
    if wrong:
        raise KernelCheckError(
            f"TensorFlow's CPU kernels compute a wrong convolution gradient here ({wrong}; relative to float64): "
            "training would be silently wrong. Set TF_ENABLE_ONEDNN_OPTS=0 before TensorFlow is imported, and report "
            "the CPU (tfnet.precision.cpu_model()).")
    strided_1x1_routed()  # decided (and said in the log where the view is taken) before training, if not before
    return errors


_RUNS = 3


def _dilated(w: tf.Tensor, d: int) -> tf.Tensor:
    """An HWIO kernel with ``d - 1`` zeros between its taps."""
    k, c, o = w.shape[0], w.shape[2], w.shape[3]
    spread = tf.pad(w[:, None, :, None], [[0, 0], [0, d - 1], [0, 0], [0, d - 1], [0, 0], [0, 0]])
    return tf.reshape(spread, [k * d, k * d, c, o])[:(k - 1) * d + 1, :(k - 1) * d + 1]


def _filter_gradient(f, x, w, gy, dtype) -> np.ndarray:
    xv, wv = tf.constant(x, dtype), tf.constant(w, dtype)
    with tf.GradientTape() as tape:
        tape.watch(wv)
        y = f(xv, wv)
    return tape.gradient(y, wv, output_gradients=tf.constant(gy, dtype)).numpy()
