"""ONNX string operators as TensorFlow string ops: ``StringConcat``, ``RegexFullMatch`` (RE2, as
onnxruntime), ``StringSplit`` (padded with empty strings, with the number of parts) and
``StringNormalizer`` (stop words, case change)."""

from __future__ import annotations

import tensorflow as tf

from tfnet.onnx.context import Ctx
from tfnet.onnx.ops import attr_text, register


@register("StringConcat", since=20)
def _string_concat(ctx: Ctx, node, attrs):
    ctx.set(node.output[0], tf.add(ctx.plain(node.input[0]), ctx.plain(node.input[1])))


@register("RegexFullMatch", since=20)
def _regex_full_match(ctx: Ctx, node, attrs):
    ctx.set(node.output[0], tf.strings.regex_full_match(ctx.plain(node.input[0]), attr_text(attrs["pattern"])))


@register("StringSplit", since=20)
def _string_split(ctx: Ctx, node, attrs):
    """Python's ``str.split``: by ``delimiter`` (consecutive ones give empty parts), or on runs of
    whitespace when it is empty or absent; at most ``maxsplit`` splits."""
    x = ctx.plain(node.input[0])
    delimiter = attr_text(attrs.get("delimiter", b"")) or None
    maxsplit = attrs.get("maxsplit", -1)
    flat = tf.reshape(x, [-1])
    if delimiter is None and maxsplit == 0:  # the string without its leading whitespace; none if nothing is left
        flat = tf.strings.regex_replace(flat, r"^\s+", "")
        kept = tf.not_equal(flat, "")
        parts = tf.RaggedTensor.from_row_lengths(tf.boolean_mask(flat, kept), tf.cast(kept, tf.int64))
    else:
        parts = tf.strings.split(flat, sep=delimiter, maxsplit=maxsplit)
        if delimiter is None:
            # On whitespace, TensorFlow's split adds an empty part when maxsplit is more than the splits a string has
            # ("hello world" with maxsplit 2: "hello", "world", ""); Python's never makes one.
            parts = tf.ragged.boolean_mask(parts, tf.ragged.map_flat_values(tf.not_equal, parts, ""))
    counts = tf.reshape(tf.cast(parts.row_lengths(), tf.int64), tf.shape(x))
    dense = parts.to_tensor(default_value="")
    dense = tf.reshape(dense, tf.concat([tf.shape(x), tf.shape(dense)[1:]], 0))
    ctx.set(node.output[0], dense)
    if len(node.output) > 1 and node.output[1]:
        ctx.set(node.output[1], counts)


@register("StringNormalizer", since=10)
def _string_normalizer(ctx: Ctx, node, attrs):
    x = ctx.plain(node.input[0])
    flat = tf.reshape(x, [-1])
    stopwords = [attr_text(w) for w in attrs.get("stopwords", [])]
    sensitive = bool(attrs.get("is_case_sensitive", 0))
    if stopwords:
        words = tf.constant(stopwords if sensitive else [w.lower() for w in stopwords])
        probe = flat if sensitive else tf.strings.lower(flat)
        flat = tf.boolean_mask(flat, ~tf.reduce_any(tf.equal(probe[:, None], words[None, :]), axis=1))
    action = attr_text(attrs.get("case_change_action", b"NONE"))
    if action == "LOWER":
        flat = tf.strings.lower(flat)
    elif action == "UPPER":
        flat = tf.strings.upper(flat)
    flat = tf.cond(tf.size(flat) > 0, lambda: flat, lambda: tf.constant([""]))  # all removed: one empty string
    ctx.set(node.output[0], flat if x.shape.rank == 1 else tf.reshape(flat, [1, -1]))
