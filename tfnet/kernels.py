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

Every other form goes to ``Conv2D`` as it is.
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["conv2d"]


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
