"""ONNX ``ImageDecoder`` (20): the encoded bytes of one image (a 1-D uint8 tensor) decoded to ``(H, W, C)`` uint8.

As onnx's reference decodes with Pillow: JPEG with libjpeg's accurate integer transform (TensorFlow's
``INTEGER_ACCURATE``; its default transform is up to 4 levels off Pillow's), PNG, BMP, WebP and GIF (its first
frame), alpha dropped; ``pixel_format`` ``RGB``, ``BGR`` or ``Grayscale``, the gray level Pillow's ``convert("L")``
computes from RGB (ITU-R 601-2 luma in 16-bit fixed point). TensorFlow has no decoder for JPEG 2000, TIFF or PNM:
such bytes fail at run time with TensorFlow's "Unknown image file format" (the format is in the data, not the
model). The bytes reach the decoder through a 256-entry table joined into one string, all TensorFlow ops, so the
graph serializes and runs on Spark's workers like any other.
"""

from __future__ import annotations

import tensorflow as tf

from tfnet.onnx.context import Ctx
from tfnet.onnx.errors import OnnxConversionError
from tfnet.onnx.ops import attr_text, register

_FORMATS = ("RGB", "BGR", "Grayscale")



@register("ImageDecoder", since=20)
def _image_decoder(ctx: Ctx, node, attrs):
    encoded = ctx.plain(node.input[0])
    pixel_format = attr_text(attrs.get("pixel_format", "RGB"))
    if pixel_format not in _FORMATS:
        raise OnnxConversionError(
            f"ImageDecoder {node.name!r}: pixel_format {pixel_format!r} is not one of {', '.join(_FORMATS)}.")
    table = tf.constant([bytes([i]) for i in range(256)])
    data = tf.strings.reduce_join(tf.gather(table, tf.cast(tf.reshape(encoded, [-1]), tf.int32)))
    jpeg = tf.equal(tf.strings.substr(data, 0, 3), b"\xff\xd8\xff")
    rgb = tf.cond(jpeg, lambda: tf.io.decode_jpeg(data, channels=3, dct_method="INTEGER_ACCURATE"),
                  lambda: tf.io.decode_image(data, channels=3, expand_animations=False))
    rgb.set_shape([None, None, 3])
    if pixel_format == "BGR":
        out = rgb[..., ::-1]
    elif pixel_format == "Grayscale":
        wide = tf.cast(rgb, tf.int32)
        luma = (wide[..., 0] * 19595 + wide[..., 1] * 38470 + wide[..., 2] * 7471 + 0x8000) // 65536
        out = tf.cast(luma, tf.uint8)[..., None]
    else:
        out = rgb
    ctx.set(node.output[0], out)
