"""ONNX ``TfIdfVectorizer`` (9): the counts (or IDF, or TF-IDF weights) of a pool of n-grams in each row of token ids
or strings, as scikit-learn's ``TfidfVectorizer`` and ``CountVectorizer`` export through skl2onnx.

As onnx's reference and onnxruntime count them: the pool lists n-grams by size (``ngram_counts``: where each size
starts in ``pool_int64s`` or ``pool_strings``), those of sizes ``min_gram_length`` to ``max_gram_length`` are counted,
each at its ``ngram_indexes`` entry; an n-gram is ``n`` tokens ``d`` apart for every ``d`` from 1 to
``max_skip_count + 1`` (a unigram once). Here each token is looked up in the pool's sorted vocabulary and each
window of the rows (per size and distance) by its key in a sorted table of the pool's n-grams, so the time grows with
the rows and the log of the pool; the rows' length may be known only at run time.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfnet.onnx.context import Ctx
from tfnet.onnx.errors import OnnxConversionError
from tfnet.onnx.ops import attr_text, register

_MODES = ("TF", "IDF", "TFIDF")


def _pool_by_size(node, attrs, strings: bool) -> dict[int, np.ndarray]:
    """``{n: the pool's n-grams of n tokens, (M, n)}``, for every size ``ngram_counts`` lists, in the pool's order."""
    pool = [attr_text(v) for v in attrs.get("pool_strings", [])] if strings else list(attrs.get("pool_int64s", []))
    starts = list(attrs.get("ngram_counts", [])) + [len(pool)]
    out = {}
    for n, (begin, end) in enumerate(zip(starts[:-1], starts[1:]), start=1):
        if end < begin or (end - begin) % n:
            raise OnnxConversionError(
                f"TfIdfVectorizer {node.name!r}: ngram_counts {starts[:-1]} give the {n}-grams {end - begin} pool "
                f"entries, not a multiple of {n}.")
        out[n] = np.array(pool[begin:end], dtype=str if strings else np.int64).reshape(-1, n)
    return out


def _token_ids(rows: tf.Tensor, vocabulary: np.ndarray, strings: bool) -> tf.Tensor:
    """Each token's place in the sorted ``vocabulary`` (the pool's distinct tokens), or ``len(vocabulary)`` for a
    token outside it. Strings are found by their 63-bit fingerprints (``to_hash_bucket_fast``), then compared."""
    known = tf.constant(vocabulary)
    if strings:
        buckets = 2 ** 63 - 1
        hashes = tf.strings.to_hash_bucket_fast(known, buckets)
        order = tf.argsort(hashes)
        sorted_keys, keys = tf.gather(hashes, order), tf.strings.to_hash_bucket_fast(rows, buckets)
    else:
        order = tf.range(len(vocabulary), dtype=tf.int64)
        sorted_keys, keys = known, rows
    at = tf.minimum(tf.searchsorted(sorted_keys, tf.reshape(keys, [-1])), len(vocabulary) - 1)
    place = tf.reshape(tf.gather(tf.cast(order, tf.int64), at), tf.shape(rows))
    return tf.where(tf.equal(tf.gather(known, place), rows), place, len(vocabulary))


@register("TfIdfVectorizer", since=9)
def _tfidf_vectorizer(ctx: Ctx, node, attrs):
    x = ctx.plain(node.input[0])
    mode = attr_text(attrs.get("mode", b""))
    strings = x.dtype == tf.string
    if mode not in _MODES or x.shape.rank not in (1, 2) or (strings and "pool_strings" not in attrs) or \
            (not strings and "pool_int64s" not in attrs):
        raise OnnxConversionError(
            f"TfIdfVectorizer {node.name!r}: mode {mode!r} (one of {', '.join(_MODES)}), a 1-D or 2-D input (this one "
            f"{x.shape}) and a pool of the input's kind ({'strings' if strings else 'integers'}) are required.")
    low, high = int(attrs["min_gram_length"]), int(attrs["max_gram_length"])
    skips = int(attrs.get("max_skip_count", 0))
    indexes = [int(i) for i in attrs["ngram_indexes"]]
    size = max(indexes) + 1
    rows = x if x.shape.rank == 2 else x[None]
    rows = rows if strings else tf.cast(rows, tf.int64)
    pools = _pool_by_size(node, attrs, strings)
    total = sum(len(g) for g in pools.values())
    vocabulary = np.unique(np.concatenate([g.ravel() for g in pools.values()]))
    base = len(vocabulary) + 1  # an n-gram's key: its tokens' places as digits in base (vocabulary + 1)
    if base ** max(pools) >= 2 ** 62:
        raise OnnxConversionError(
            f"TfIdfVectorizer {node.name!r}: {len(vocabulary)} distinct tokens in n-grams of up to {max(pools)} "
            "tokens make keys past 62 bits.")
    weights = np.asarray(attrs.get("weights", []), np.float32)
    if len(indexes) != total or (len(weights) and len(weights) != total):
        raise OnnxConversionError(
            f"TfIdfVectorizer {node.name!r}: its pool holds {total} n-grams (ngram_counts {list(attrs['ngram_counts'])})"
            f" but ngram_indexes has {len(indexes)} entries and weights {len(weights)}; ONNX asks for one of each per "
            "n-gram.")
    ids = _token_ids(rows, vocabulary, strings)
    length, n_rows = tf.shape(rows)[1], tf.shape(rows)[0]
    counts = []  # (N, the size's pool n-grams) per size: how often each occurs, every distance summed
    for n, grams in pools.items():
        if not len(grams):
            continue
        if not low <= n <= high:  # not counted
            counts.append(tf.zeros(tf.stack([n_rows, len(grams)]), tf.float32))
            continue
        places = np.searchsorted(vocabulary, grams)
        keys = (places * base ** np.arange(n)).sum(1)
        order = np.argsort(keys, kind="stable")
        sorted_keys = tf.constant(keys[order])
        found = None
        for d in range(1, skips + 2) if n > 1 else [1]:
            windows = tf.maximum(length - d * (n - 1), 0)  # n tokens d apart
            key = tf.add_n([ids[:, d * k:d * k + windows] * base ** k for k in range(n)])  # (N, windows)
            at = tf.reshape(tf.minimum(tf.searchsorted(sorted_keys, tf.reshape(key, [-1])), len(grams) - 1),
                            tf.shape(key))
            which = tf.where(tf.equal(tf.gather(sorted_keys, at), key), tf.gather(tf.constant(order), at), len(grams))
            hits = tf.math.bincount(tf.cast(which, tf.int32), minlength=len(grams) + 1, maxlength=len(grams) + 1,
                                    axis=-1, dtype=tf.float32)[:, :len(grams)]
            found = hits if found is None else found + hits
        counts.append(found)
    per_gram = tf.concat(counts, 1) if counts else tf.zeros(tf.stack([n_rows, total]), tf.float32)  # pool order

    def to_columns(values):  # (N, pool n-grams) summed into (N, output size) by ngram_indexes
        return tf.transpose(tf.math.unsorted_segment_sum(tf.transpose(values), tf.constant(indexes), size))

    if mode == "TF" or (mode == "TFIDF" and not len(weights)):
        out = to_columns(per_gram)
    elif mode == "TFIDF":
        out = to_columns(per_gram * weights)
    elif len(weights):  # IDF: an n-gram's weight where it occurs
        out = to_columns(tf.cast(per_gram > 0, tf.float32) * weights)
    else:
        out = tf.cast(to_columns(per_gram) > 0, tf.float32)
    ctx.set(node.output[0], out if x.shape.rank == 2 else out[0])
