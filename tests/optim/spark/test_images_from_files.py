"""Fine-tuning on images as they sit in a data lake: PNG files written by the test, read with
``spark.read.format("binaryFile")``, labels from the path (``regexp_extract``), decoded and
resized on the ranks, augmented (random crop and flip) on the ranks, over a real local[2] Spark
with two Horovod ranks; held-out accuracy from a distributed evaluate."""

import numpy as np
import pytest

import optim
from optim import TFDataset, TFOptimizer
from optim.training.augment import RandomCropFlip
from tfnet import TFNet

pytestmark = [pytest.mark.spark, pytest.mark.parallel]


def write_crops(root, n_train=96, n_test=32, size=48, seed=0):
    """Random crops of scikit-learn's two sample photos, as PNG files under root/{train,test}/{china,flower}/."""
    import tensorflow as tf
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(seed)
    photos = dict(zip(["china", "flower"], load_sample_images().images))
    for split, n in (("train", n_train), ("test", n_test)):
        for name, photo in photos.items():
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(n):
                y, x = rng.integers(0, photo.shape[0] - size), rng.integers(0, photo.shape[1] - size)
                png = tf.io.encode_png(photo[y:y + size, x:x + size]).numpy()
                (folder / f"crop-{i:03d}.png").write_bytes(png)


def image_df(spark, folder):
    from pyspark.sql import functions as F

    df = spark.read.format("binaryFile").option("pathGlobFilter", "*.png").option("recursiveFileLookup", "true") \
        .load(str(folder))
    name = F.regexp_extract("path", r"/(china|flower)/crop-", 1)
    return df.withColumn("label", F.when(name == "flower", 1).otherwise(0)).select("content", "label")


def test_fine_tune_on_png_files_read_with_binary_file(spark, tmp_path):
    import keras

    write_crops(tmp_path)
    train = image_df(spark, tmp_path / "train").repartition(2)
    test = image_df(spark, tmp_path / "test")
    assert train.count() == 192 and sorted(r["label"] for r in test.select("label").distinct().collect()) == [0, 1]
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((32, 32, 3), name="image"), keras.layers.Rescaling(1 / 255.0),
                              keras.layers.Conv2D(8, 3, activation="relu"), keras.layers.MaxPooling2D(),
                              keras.layers.Conv2D(16, 3, activation="relu"), keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(2, name="logits")])
    aug = RandomCropFlip(padding=2, flip=0.5)
    data = TFDataset.from_dataframe(train, "content", "label", feature_shapes={"content": (32, 32, 3)}, augment=aug)
    opt = TFOptimizer(TFNet.from_keras(model), optim.losses.SparseCategoricalCrossentropy(from_logits=True),
                      optim.Adam(0.01), metrics=["accuracy"])
    opt.optimize(data, epochs=15, batch_size=16, num_workers=2, verbose=0)
    held_out = opt.evaluate(TFDataset.from_dataframe(test, "content", "label", feature_shapes={"content": (32, 32, 3)}))
    assert held_out["accuracy"] >= 0.95, held_out


def test_random_crop_flip_is_seeded_and_training_only():
    from optim.data.arrays import ArrayDataset

    x = np.arange(2 * 4 * 4 * 1, dtype=np.float32).reshape(2, 4, 4, 1)
    ds = ArrayDataset([x], [np.zeros(2)], augment=RandomCropFlip(padding=1, flip=1.0))
    a = next(ds.batches(2, shuffle=False, training=True))[0][0]
    b = next(ds.batches(2, shuffle=False, training=True))[0][0]
    np.testing.assert_array_equal(a, b)  # seeded by [seed, epoch, rank, batch]
    assert not np.array_equal(a, x), "augmented"
    np.testing.assert_array_equal(next(ds.batches(2, shuffle=False))[0][0], x)  # evaluation: untouched
    with pytest.raises(ValueError, match=r"`flip` must be a probability in \[0, 1\]. Received: flip=2"):
        RandomCropFlip(flip=2)
