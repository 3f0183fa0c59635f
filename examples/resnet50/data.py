"""ImageNet input pipelines in tf.data, built on each rank: TFRecord shards
(``train-00000-of-01024`` with ``image/encoded`` and ``image/class/label``), a JPEG folder tree
(one directory per class), or synthetic tensors.

Preprocessing is the standard ResNet-50 one: decode; for training a random crop (Inception-style
distorted bounding box) and a horizontal flip; for evaluation a resize of the shorter side to
``size / 0.875`` and a central crop; then per-channel mean and std normalisation.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

MEAN_RGB = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STD_RGB = (0.229 * 255, 0.224 * 255, 0.225 * 255)
CROP_FRACTION = 0.875


class DataSourceError(ValueError):
    """The data folder does not hold what the chosen format needs."""


@dataclass(frozen=True)
class Source:
    """Where the images are. ``kind`` is ``"tfrecord"``, ``"jpeg"`` or ``"synthetic"``."""

    kind: str
    data_dir: str | None = None
    image_size: int = 224
    classes: int = 1000
    label_offset: int = 0
    synthetic_batches: int = 8


def normalize(image: tf.Tensor) -> tf.Tensor:
    return (tf.cast(image, tf.float32) - MEAN_RGB) / STD_RGB


def preprocess_train(image_bytes: tf.Tensor, size: int) -> tf.Tensor:
    image = tf.io.decode_image(image_bytes, channels=3, expand_animations=False)
    begin, crop_size, _ = tf.image.sample_distorted_bounding_box(
        tf.shape(image), bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]), min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0), max_attempts=10, use_image_if_no_bounding_boxes=True)
    image = tf.slice(image, begin, crop_size)
    image = tf.image.resize(image, [size, size], method="bilinear")
    image = tf.image.random_flip_left_right(image)
    return normalize(image)


def preprocess_eval(image_bytes: tf.Tensor, size: int) -> tf.Tensor:
    image = tf.io.decode_image(image_bytes, channels=3, expand_animations=False)
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    scale = (size / CROP_FRACTION) / tf.reduce_min(shape)
    new = tf.cast(tf.round(shape * scale), tf.int32)
    image = tf.image.resize(image, new, method="bilinear")
    top = (new[0] - size) // 2
    left = (new[1] - size) // 2
    image = image[top:top + size, left:left + size, :]
    image.set_shape([size, size, 3])
    return normalize(image)


def tfrecord_files(data_dir: str, split: str) -> list[str]:
    files = sorted(glob.glob(os.path.join(data_dir, f"{split}-*-of-*")))
    if not files:
        raise DataSourceError(
            f"No TFRecord shards named '{split}-NNNNN-of-NNNNN' in {data_dir!r}. Expected the ImageNet layout "
            "(train-00000-of-01024, ..., validation-00000-of-00128)."
        )
    return files


def jpeg_tree(data_dir: str, split: str) -> tuple[list[str], list[int], list[str]]:
    """Files, labels and class names of ``data_dir/split/<class>/*.jpg`` (or ``data_dir/<class>``)."""
    root = os.path.join(data_dir, split) if os.path.isdir(os.path.join(data_dir, split)) else data_dir
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))) if os.path.isdir(root) else []
    files, labels = [], []
    for i, c in enumerate(classes):
        for f in sorted(os.listdir(os.path.join(root, c))):
            if f.lower().endswith((".jpg", ".jpeg", ".png")):
                files.append(os.path.join(root, c, f))
                labels.append(i)
    if not files:
        raise DataSourceError(f"No images in class folders under {root!r}; expected {root}/<class>/<image>.jpg.")
    return files, labels, classes


def _parse_example(serialized, label_offset: int):
    features = tf.io.parse_single_example(serialized, {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    })
    return features["image/encoded"], features["image/class/label"] - label_offset


def make_dataset(source: Source, split: str, *, rank: int = 0, size: int = 1, batch: int = 32,
                 training: bool = True, seed: int = 0) -> tf.data.Dataset:
    """One rank's batched ``(images, labels)`` dataset. Files are sharded across ranks when there
    are enough of them, else examples are."""
    if source.kind == "synthetic":
        rng = np.random.default_rng([seed, rank])
        x = rng.uniform(-2, 2, (batch, source.image_size, source.image_size, 3)).astype("float32")
        y = rng.integers(0, source.classes, batch).astype("int64")
        return tf.data.Dataset.from_tensors((x, y)).repeat(source.synthetic_batches)
    if source.kind == "tfrecord":
        files = tfrecord_files(source.data_dir, split)
        ds = tf.data.Dataset.from_tensor_slices(files)
        ds = ds.shard(size, rank) if len(files) >= size else ds
        if training:
            ds = ds.shuffle(len(files), seed=seed)
        ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=tf.data.AUTOTUNE,
                           deterministic=True)
        if len(files) < size:
            ds = ds.shard(size, rank)
        ds = ds.map(lambda s: _parse_example(s, source.label_offset), num_parallel_calls=tf.data.AUTOTUNE)
    elif source.kind == "jpeg":
        files, labels, _ = jpeg_tree(source.data_dir, split)
        ds = tf.data.Dataset.from_tensor_slices((files, np.asarray(labels, np.int64))).shard(size, rank)
        ds = ds.map(lambda f, y: (tf.io.read_file(f), y), num_parallel_calls=tf.data.AUTOTUNE)
    else:
        raise DataSourceError(f"Unknown data format {source.kind!r}; use tfrecord, jpeg or synthetic.")
    if training:
        ds = ds.shuffle(10 * batch, seed=seed, reshuffle_each_iteration=True)
    fn = preprocess_train if training else preprocess_eval
    ds = ds.map(lambda b, y: (fn(b, source.image_size), y), num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True)
    return ds.batch(batch, drop_remainder=training).prefetch(tf.data.AUTOTUNE)


def count_classes(source: Source) -> int:
    if source.kind == "jpeg":
        return len(jpeg_tree(source.data_dir, "train")[2])
    return source.classes
