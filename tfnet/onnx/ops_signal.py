"""ONNX ``DFT`` and ``STFT`` as TensorFlow's FFTs, and ``MelWeightMatrix``.

Complex values are ONNX's trailing dimension of 2 (real, imaginary); a trailing dimension of 1 is a
real signal. ``DFT``: along any axis (an attribute in version 17, an input from 20), forward or inverse
(scaled by 1/n), ``onesided``, a ``dft_length`` that pads or cuts the signal. ``STFT``: frames of
``frame_length`` every ``frame_step``, times the window, one-sided by default.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfnet.onnx.context import Ctx
from tfnet.onnx.errors import OnnxConversionError
from tfnet.onnx.ops import register, tf_dtype


def _complex(x: tf.Tensor) -> tf.Tensor:
    """ONNX's (..., 1) real or (..., 2) complex layout as a complex128 tensor (computed in double
    precision, as numpy's FFT, so that exact zeros stay zeros when cast back)."""
    real = tf.cast(x, tf.float64)
    if x.shape[-1] == 1:
        return tf.complex(real[..., 0], tf.zeros_like(real[..., 0]))
    return tf.complex(real[..., 0], real[..., 1])


def _pair(z: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    return tf.cast(tf.stack([tf.math.real(z), tf.math.imag(z)], -1), dtype)


def _static_int(ctx: Ctx, name: str, what: str, node) -> int | None:
    if not name:
        return None
    value = ctx.static_ints(name)
    if value is None:
        raise OnnxConversionError(f"{node.op_type} {node.name!r}: {what} must be known while converting.")
    return value[0]


@register("DFT", since=17)
def _dft(ctx: Ctx, node, attrs):
    x = ctx.plain(node.input[0])
    rank = x.shape.rank
    length = _static_int(ctx, node.input[1] if len(node.input) > 1 else "", "dft_length", node)
    if ctx.version >= 20:
        axis = _static_int(ctx, node.input[2] if len(node.input) > 2 else "", "axis", node)
        axis = -2 if axis is None else axis
    else:
        axis = attrs.get("axis", 1)
    axis = axis + rank if axis < 0 else axis  # counted with the trailing complex dimension
    z = _complex(x)
    perm = [i for i in range(rank - 1) if i != axis] + [axis]
    z = tf.transpose(z, perm)
    n = z.shape[-1]
    inverse, onesided = attrs.get("inverse", 0), attrs.get("onesided", 0)
    if inverse and onesided:  # a one-sided spectrum back to a real signal
        y = tf.signal.irfft(z, fft_length=[length or 2 * (n - 1)])
        y = tf.transpose(y, list(np.argsort(perm)))
        ctx.set(node.output[0], tf.cast(y, x.dtype)[..., None])
        return
    if length is not None and n is not None and length != n:
        z = z[..., :length] if length < n else tf.pad(z, [[0, 0]] * (rank - 2) + [[0, length - n]])
        n = length
    y = tf.signal.ifft(z) if inverse else tf.signal.fft(z)
    if onesided:
        y = y[..., : n // 2 + 1]
    y = tf.transpose(y, list(np.argsort(perm)))
    ctx.set(node.output[0], _pair(y, x.dtype))


@register("STFT", since=17)
def _stft(ctx: Ctx, node, attrs):
    signal = ctx.plain(node.input[0])
    step = _static_int(ctx, node.input[1], "frame_step", node)
    window = ctx.plain(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    length = _static_int(ctx, node.input[3] if len(node.input) > 3 else "", "frame_length", node)
    if length is None:
        length = window.shape[0]
    frames = tf.signal.frame(_complex(signal), length, step, axis=1)  # (batch, frames, length)
    if window is not None:
        frames = frames * tf.cast(window, frames.dtype)
    y = tf.signal.fft(frames)
    if attrs.get("onesided", 1):
        y = y[..., : length // 2 + 1]
    ctx.set(node.output[0], _pair(y, signal.dtype))


@register("MelWeightMatrix", since=17)
def _mel_weight_matrix(ctx: Ctx, node, attrs):
    """The (dft_length // 2 + 1, num_mel_bins) matrix of triangular mel filters, as onnx's reference and numpy compute
    it: ``num_mel_bins + 2`` points evenly spaced on the mel scale from the lower to the upper edge (the edges' mels
    in their own precision, the rest in double), each mapped to the FFT bin ``floor((dft_length + 1) * hz /
    sample_rate)``; filter ``i`` rises from point ``i`` to ``i + 1`` and falls to ``i + 2``. Its inputs may be
    known only at run time (its shape then is too); it has no gradient (ONNX defines none)."""
    bins, length, rate = (tf.cast(tf.reshape(ctx.plain(node.input[k]), []), tf.int64) for k in range(3))
    edges = []
    for k in (3, 4):  # 2595 * log10(1 + hz / 700), numpy's order: the edge's dtype, then double
        hz = tf.reshape(ctx.plain(node.input[k]), [])
        hz = hz if hz.dtype.is_floating else tf.cast(hz, tf.float64)
        edges.append(tf.cast(2595 * tf.math.log1p(hz / tf.cast(700, hz.dtype)), tf.float64) / np.log(10))
    step = (edges[1] - edges[0]) / tf.cast(bins + 2, tf.float64)
    mels = tf.cast(tf.range(bins + 2), tf.float64) * step + edges[0]
    hz = 700 * tf.math.expm1(mels / 2595 * np.log(10))
    points = tf.cast(tf.math.floordiv(tf.cast(length + 1, tf.float64) * hz, tf.cast(rate, tf.float64)), tf.int64)
    low, center, high = points[None, :-2], points[None, 1:-1], points[None, 2:]  # (1, bins) each
    j = tf.range(length // 2 + 1, dtype=tf.int64)[:, None]
    rise, fall = center - low, high - center
    rising = tf.where(tf.equal(rise, 0), tf.cast(tf.equal(j, center), tf.float64),
                      tf.where((j >= low) & (j <= center), tf.cast(j - low, tf.float64) /
                               tf.cast(tf.maximum(rise, 1), tf.float64), 0.0))
    falling = tf.cast(high - j, tf.float64) / tf.cast(tf.maximum(fall, 1), tf.float64)
    out = tf.where((fall > 0) & (j >= center) & (j < high), falling, rising)  # the falling side is written last
    ctx.set(node.output[0], tf.cast(out, tf_dtype(attrs.get("output_datatype", 1))))
