"""ONNX ``Resize`` to sizes known only at run time (a mask pasted at its box's size inside a ``Loop``, as torchvision's
Mask R-CNN writes it; an input whose spatial size is not fixed): nearest, linear and cubic, separable along each axis, the
source coordinates computed by TensorFlow from the run-time sizes with the same coordinate transformations as
:mod:`tfnet.onnx.ops_resize`'s while-converting path (onnx's reference), then one gather (nearest), two (linear) or four
(cubic, Keys' kernel) per resized axis, the taps clamped to the edge. ``antialias``, ``tf_crop_and_resize``,
``half_pixel_symmetric`` and a ``keep_aspect_ratio_policy`` other than ``stretch`` need sizes known while converting."""

from __future__ import annotations

import tensorflow as tf

from tfnet.onnx.errors import OnnxConversionError

COORDINATES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn")
NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def check(name: str, mode: str, coord: str, nearest: str, policy: str, antialias: bool) -> None:
    """Raises OnnxConversionError naming what the run-time path does not take."""
    reasons = [what for what, bad in (
        (f"mode {mode!r}", mode not in ("nearest", "linear", "cubic")),
        (f"coordinate_transformation_mode {coord!r}", coord not in COORDINATES),
        (f"nearest_mode {nearest!r}", mode == "nearest" and nearest not in NEAREST),
        ("antialias", antialias),
        (f"keep_aspect_ratio_policy {policy!r}", policy != "stretch")) if bad]
    if reasons:
        raise OnnxConversionError(
            f"Resize {name!r}: its sizes are known only at run time, where tfnet resizes with nearest, linear and cubic "
            f"modes and the coordinate transformations {', '.join(COORDINATES)}; this one has {', '.join(reasons)}.")


def source_coordinates(coord: str, out: tf.Tensor, size: tf.Tensor, scale: tf.Tensor) -> tf.Tensor:
    """The source coordinate of each of the ``out`` output positions along an axis of ``size`` (float64 scalars;
    ``scale`` the output's size over the input's, or the given scale)."""
    y = tf.range(out, dtype=tf.float64)
    width = scale * size  # the output length before rounding
    if coord == "align_corners":
        return tf.where(tf.equal(width, 1.0), tf.zeros_like(y), y * (size - 1) / tf.maximum(width - 1, 1e-300))
    if coord == "asymmetric":
        return y / scale
    if coord == "pytorch_half_pixel":
        return tf.where(tf.equal(width, 1.0), tf.fill(tf.shape(y), tf.constant(-0.5, tf.float64)), (y + 0.5) / scale - 0.5)
    if coord == "tf_half_pixel_for_nn":
        return (y + 0.5) / scale
    return (y + 0.5) / scale - 0.5  # half_pixel


def resize_axis(x: tf.Tensor, axis: int, out: tf.Tensor, scale: tf.Tensor | None, mode: str, coord: str,
                nearest: str, a: float = -0.75, exclude_outside: bool = False) -> tf.Tensor:
    """``x`` resized along ``axis`` to ``out`` positions (an int scalar tensor); ``scale`` (float64) where given, else
    ``out`` over the input's size; ``a`` and ``exclude_outside``: cubic's ``cubic_coeff_a`` and ``exclude_outside``."""
    size = tf.cast(tf.shape(x, out_type=tf.int64)[axis], tf.float64)
    out = tf.cast(out, tf.int64)
    scale = tf.cast(out, tf.float64) / size if scale is None else scale
    at = source_coordinates(coord, tf.cast(out, tf.float64), size, scale)
    last = size - 1
    if mode == "nearest":
        picked = {"round_prefer_floor": tf.math.ceil(at - 0.5), "round_prefer_ceil": tf.floor(at + 0.5),
                  "floor": tf.floor(at), "ceil": tf.math.ceil(at)}[nearest]
        return tf.gather(x, tf.cast(tf.clip_by_value(picked, 0.0, last), tf.int64), axis=axis)
    shape = tf.tensor_scatter_nd_update(tf.ones([x.shape.rank], tf.int64), [[axis]], [out])
    if mode == "linear":
        at = tf.clip_by_value(at, 0.0, last)  # linear taps beyond the edge read the edge
        low = tf.floor(at)
        high = tf.minimum(low + 1, last)
        frac = tf.reshape(tf.cast(at - low, x.dtype), shape)
        return (tf.gather(x, tf.cast(low, tf.int64), axis=axis) * (1 - frac)
                + tf.gather(x, tf.cast(high, tf.int64), axis=axis) * frac)
    base = tf.floor(at)  # cubic: Keys' kernel over four taps, which clamp to the edge (or, excluded, weigh nothing)
    t = at - base
    taps = [base + k for k in (-1.0, 0.0, 1.0, 2.0)]
    weights = [_keys(t + 1, a), _keys(t, a), _keys(1 - t, a), _keys(2 - t, a)]
    if exclude_outside:
        weights = [tf.where((i < 0) | (i > last), tf.zeros_like(w), w) for i, w in zip(taps, weights)]
        total = tf.add_n(weights)
        weights = [w / tf.where(tf.equal(total, 0.0), tf.ones_like(total), total) for w in weights]
    return tf.add_n([tf.gather(x, tf.cast(tf.clip_by_value(i, 0.0, last), tf.int64), axis=axis)
                     * tf.reshape(tf.cast(w, x.dtype), shape) for i, w in zip(taps, weights)])


def _keys(s: tf.Tensor, a: float) -> tf.Tensor:
    """Keys' cubic convolution kernel at distance ``s`` (0 to 2), with ``cubic_coeff_a`` ``a``."""
    s = tf.abs(s)
    near = ((a + 2) * s - (a + 3)) * s * s + 1
    far = ((a * s - 5 * a) * s + 8 * a) * s - 4 * a
    return tf.where(s <= 1, near, tf.where(s < 2, far, tf.zeros_like(s)))
