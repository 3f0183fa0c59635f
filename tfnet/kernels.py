"""2-D convolutions in the forms whose gradients every x86-64 CPU computes right, oneDNN on or off.

TensorFlow 2.21 picks its CPU kernels by CPU and by ``TF_ENABLE_ONEDNN_OPTS``, and two forms of ``Conv2D`` fail on
some of them (measured against float64, docs/benchmarks.md, "Kernels on every CPU"):

* **A 1x1 kernel with a stride above 1.** With oneDNN on and only AVX2 (AMD Zen 3; on any CPU with
  ``ONEDNN_MAX_CPU_ISA=AVX2``), oneDNN's filter gradient is 0.2 to 1.2 (relative) off when the input has fewer than
  8 channels (for example 2x8x8x4 to 8 channels, stride 2: ResNet's downsample in a small net), in a
  ``tf.function`` and eagerly; the forward pass is right, and so are the same shapes with AVX-512. The same
  kernel over every s-th pixel with stride 1 is the same convolution, exactly, and cheaper: :func:`conv2d`
  slices first.
* **A dilation above 1.** TensorFlow's own ``Conv2DBackpropFilter`` ("Current CPU implementations do not yet
  support dilation rates larger than 1"), the kernel that runs with oneDNN off and on AVX2-only CPUs, has none.
  :func:`conv2d` runs a dilated convolution through space-to-batch, as ``tf.nn.convolution`` does.

Every other form goes to ``Conv2D`` as it is. :func:`rewrite_graph` does the first of these to the graphs tfnet
loads (a Keras model's, a TF1 checkpoint's), where the convolutions are single ops already.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2, types_pb2
from tensorflow.python.framework import tensor_util

__all__ = ["conv2d", "rewrite_graph"]


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
    if one_by_one and strides != [1, 1]:
        if isinstance(padding, list):
            x = tf.pad(x, padding)
        # a 1x1 window needs no padding for SAME: its stride-s output reads every s-th pixel from the first
        return _raw(x[:, ::strides[0], ::strides[1], :], kernel, [1, 1], [1, 1], "VALID")
    if dilations == [1, 1] or one_by_one:
        return _raw(x, kernel, strides, [1, 1], padding)
    if padding == "SAME" and strides != [1, 1]:  # SAME's padding at stride s, then a stride-1 convolution
        padding = _same_padding(x, kernel, strides, dilations)
    if isinstance(padding, list) or not isinstance(padding, str):
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
    """``graph_def`` with each NHWC ``Conv2D`` of a 1x1 kernel and a stride above 1 (SAME or VALID) reading a strided
    view of its input at stride 1, as :func:`conv2d` runs it; and how many it rewrote. The graph of a Keras model or
    a TF1 checkpoint holds such convolutions as single ops. ``graph`` is the graph before batch-norm folding
    imported (``name=""``), for the filters' static shapes; a convolution it lacks (one that folding made) is looked up
    in ``graph_def`` imported here. Like batch-norm folding (tfnet.fold), this changes the graph that runs, never the
    graph that is saved."""
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    taken = {n.name for n in out.node}
    shapes_of = graph
    added, count = [], 0
    for node in out.node:
        strides = list(node.attr["strides"].list.i) if node.op == "Conv2D" else []
        if (not strides or strides[1:3] == [1, 1] or node.attr["data_format"].s not in (b"", b"NHWC")
                or node.attr["padding"].s not in (b"SAME", b"VALID")):
            continue
        try:
            kernel = graph.get_operation_by_name(node.name).inputs[1].shape
        except KeyError:  # a convolution that folding made (tfnet.fold): the shapes of graph_def itself
            if graph is shapes_of:
                graph = tf.Graph()
                with graph.as_default():
                    tf.graph_util.import_graph_def(graph_def, name="")
            kernel = graph.get_operation_by_name(node.name).inputs[1].shape
        if kernel.rank != 4 or kernel[0] != 1 or kernel[1] != 1:
            continue
        prefix = f"{node.name}/tfnet_strided_view"
        while any(n == prefix or n.startswith(prefix + "/") for n in taken):
            prefix += "_"
        consts = {part: value for part, value in (("begin", [0] * 4), ("end", [0] * 4), ("strides", strides))}
        for part, value in consts.items():
            added.append(node_def_pb2.NodeDef(
                name=f"{prefix}/{part}", op="Const",
                attr={"dtype": attr_value_pb2.AttrValue(type=types_pb2.DT_INT32),
                      "value": attr_value_pb2.AttrValue(tensor=tensor_util.make_tensor_proto(value, tf.int32))}))
        view = node_def_pb2.NodeDef(name=prefix, op="StridedSlice",
                                    input=[node.input[0]] + [f"{prefix}/{part}" for part in consts])
        view.attr["T"].CopyFrom(node.attr["T"])
        view.attr["Index"].type = types_pb2.DT_INT32
        view.attr["begin_mask"].i = view.attr["end_mask"].i = 15
        if node.device:
            view.device = node.device
        added.append(view)
        node.input[0] = prefix
        node.attr["strides"].list.i[:] = [1, 1, 1, 1]
        node.attr["padding"].s = b"VALID"
        count += 1
    out.node.extend(added)
    return out, count
