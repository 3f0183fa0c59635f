"""ONNX ``Col2Im`` (version 18; what PyTorch exports ``nn.Fold`` as): sliding blocks summed back into an image, the
adjoint of extracting them (``nn.Unfold``, ``tf.image.extract_patches``), for any number of spatial dimensions, with
``strides``, ``dilations`` and ``pads`` (the padded border is dropped).

Each element of the input lands on one pixel of the padded image, given by its block offset and its block's place;
that map is computed while converting (``image_shape`` and ``block_shape`` must be known then), so the op is one
``unsorted_segment_sum`` over it, whose gradient is a gather. Elements that land in the padding go to one extra
segment, which is dropped.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from tfnet.onnx.context import Ctx
from tfnet.onnx.errors import OnnxConversionError
from tfnet.onnx.ops import register


def pixel_map(image: list[int], block: list[int], strides: list[int], dilations: list[int],
              pads: list[int]) -> np.ndarray:
    """``(prod(block), blocks)``: the flat pixel of the image (row-major) that each block offset of each block
    lands on, or ``prod(image)`` where it lands in the padding; blocks in row-major order of their places."""
    n = len(image)
    padded = [size + pads[d] + pads[d + n] for d, size in enumerate(image)]
    counts = [(p - (d * (b - 1) + 1)) // s + 1 for p, b, s, d in zip(padded, block, strides, dilations)]
    if min(counts) < 1:
        raise ValueError(f"no block of {block} (dilations {dilations}) fits in the padded image {padded}")
    offsets = np.indices(block).reshape(n, -1)  # (n, K)
    places = np.indices(counts).reshape(n, -1)  # (n, L)
    step, spread = np.asarray(strides)[:, None, None], np.asarray(dilations)[:, None, None]
    at = places[:, None, :] * step + offsets[:, :, None] * spread - np.asarray(pads[:n])[:, None, None]  # (n, K, L)
    inside = np.all((at >= 0) & (at < np.asarray(image)[:, None, None]), axis=0)
    flat = np.ravel_multi_index(tuple(np.clip(at, 0, None)), image, mode="clip")
    return np.where(inside, flat, math.prod(image))


@register("Col2Im", since=18)
def _col2im(ctx: Ctx, node, attrs):
    x = ctx.plain(node.input[0])  # (N, C * prod(block), blocks)
    image, block = ctx.static_ints(node.input[1]), ctx.static_ints(node.input[2])
    if image is None or block is None:
        raise OnnxConversionError(f"Col2Im {node.name!r}: image_shape and block_shape must be known while converting.")
    n = len(image)
    strides = list(attrs.get("strides", [1] * n))
    dilations = list(attrs.get("dilations", [1] * n))
    pads = list(attrs.get("pads", [0] * 2 * n))
    try:
        where = pixel_map(image, block, strides, dilations, pads)
    except ValueError as exc:
        raise OnnxConversionError(f"Col2Im {node.name!r}: {exc}.") from None
    k, blocks = where.shape
    if x.shape.rank != 3 or (x.shape[2] is not None and x.shape[2] != blocks) or (
            x.shape[1] is not None and x.shape[1] % k):
        raise OnnxConversionError(
            f"Col2Im {node.name!r}: the input {x.shape} is not (N, C x {k}, {blocks}) for blocks {block} over "
            f"{image} (strides {strides}, dilations {dilations}, pads {pads}).")
    shape = tf.shape(x)
    channels = shape[1] // k
    data = tf.transpose(tf.reshape(x, [shape[0], channels, k * blocks]), [2, 0, 1])  # (K * L, N, C)
    pixels = math.prod(image)
    summed = tf.math.unsorted_segment_sum(data, tf.constant(where.reshape(-1), tf.int32), pixels + 1)[:pixels]
    y = tf.reshape(tf.transpose(summed, [1, 2, 0]), tf.concat([[shape[0], channels], image], 0))
    ctx.set(node.output[0], y)
