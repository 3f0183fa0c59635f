"""The ResNet-50 script on local[2], on a tiny generated ImageNet-layout TFRecord set and JPEG tree
(a few dozen small real images: scikit-learn's digits, upscaled)."""

import json
import os
import statistics

import numpy as np
import pytest
import tensorflow as tf

from examples.resnet50 import train
from examples.resnet50.data import DataSourceError, Source, make_dataset

pytestmark = pytest.mark.spark

CLASSES = 4


def _images(n_per_class=12, size=40):
    from sklearn.datasets import load_digits

    d = load_digits()
    out = []
    for c in range(CLASSES):
        imgs = d.images[d.target == c][:n_per_class]
        for img in imgs:
            rgb = np.repeat((img / 16.0 * 255).astype("uint8")[:, :, None], 3, axis=2)
            big = tf.image.resize(rgb, [size, size], method="nearest").numpy().astype("uint8")
            out.append((tf.io.encode_jpeg(big).numpy(), c))
    return out


@pytest.fixture(scope="module")
def imagenet_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("imagenet")
    images = _images()
    rng = np.random.default_rng(0)
    order = rng.permutation(len(images))
    train_idx, val_idx = order[:36], order[36:]
    # TFRecord shards in the ImageNet layout
    tfr = root / "tfrecord"
    tfr.mkdir()
    for split, idx, shards in (("train", train_idx, 4), ("validation", val_idx, 2)):
        for s in range(shards):
            path = tfr / f"{split}-{s:05d}-of-{shards:05d}"
            with tf.io.TFRecordWriter(str(path)) as w:
                for i in idx[s::shards]:
                    data, label = images[i]
                    ex = tf.train.Example(features=tf.train.Features(feature={
                        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
                        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                    }))
                    w.write(ex.SerializeToString())
    # a JPEG folder tree
    jpg = root / "jpeg"
    for split, idx in (("train", train_idx), ("validation", val_idx)):
        for i in idx:
            data, label = images[i]
            folder = jpg / split / f"n0000{label}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"img_{i}.jpg").write_bytes(data)
    return str(tfr), str(jpg)


def test_preprocessing_shapes_and_normalisation(imagenet_dirs):
    tfr, jpg = imagenet_dirs
    src = Source("tfrecord", tfr, image_size=32, classes=CLASSES)
    x, y = next(iter(make_dataset(src, "train", batch=4, training=True)))
    assert x.shape == (4, 32, 32, 3) and x.dtype == tf.float32
    assert -3 < float(tf.reduce_min(x)) and float(tf.reduce_max(x)) < 3  # mean/std normalised
    assert set(y.numpy()) <= set(range(CLASSES))
    src = Source("jpeg", jpg, image_size=32)
    xe, _ = next(iter(make_dataset(src, "validation", batch=3, training=False)))
    xe2, _ = next(iter(make_dataset(src, "validation", batch=3, training=False)))
    np.testing.assert_array_equal(xe.numpy(), xe2.numpy())  # evaluation crops are deterministic
    with pytest.raises(DataSourceError, match="No TFRecord shards named 'train-NNNNN-of-NNNNN'"):
        make_dataset(Source("tfrecord", jpg), "train")


@pytest.mark.parametrize("fmt", ["tfrecord", "jpeg"])
def test_each_rank_reads_its_own_share_of_the_images_once(imagenet_dirs, fmt):
    """What differs between the data formats in train mode is only each rank's dataset: the two ranks' shares of an
    epoch are disjoint and together every training image once (by label counts and by the decoded pixels)."""
    data_dir = imagenet_dirs[0] if fmt == "tfrecord" else imagenet_dirs[1]
    src = Source(fmt, data_dir, image_size=32, classes=CLASSES)
    whole = [(x.numpy(), y.numpy()) for x, y in make_dataset(src, "train", batch=1, training=False)]
    shares = [[(x.numpy(), y.numpy()) for x, y in make_dataset(src, "train", rank=r, size=2, batch=1,
                                                                 training=False)] for r in (0, 1)]
    assert len(whole) == 36 and [len(s) for s in shares] == [18, 18]
    key = lambda pair: (int(pair[1][0]), pair[0].tobytes())  # noqa: E731
    assert sorted(map(key, shares[0] + shares[1])) == sorted(map(key, whole))
    assert not set(map(key, shares[0])) & set(map(key, shares[1]))


def test_train_mode_on_local2_with_scaling_and_the_bars_throughput_in_the_table(spark, imagenet_dirs, tmp_path, capsys):
    """Train mode over Spark, on the TFRecord shards (the JPEG tree differs only in each rank's dataset: above), with
    ``--scaling`` (one rank trains one epoch after the two-rank run). The progress bar's samples_per_sec (an epoch's
    images over the seconds since it began, the first step's compile in epoch 1) and the table's steady throughput
    (median step) differ many times over on a short run; the table names each, and its bar figure is the one the bar
    showed. One run for both (each two-rank ResNet-50 run compiles the step on each rank: about 70 s on a 2-core
    Zen 3); the synthetic images train in tests/optim/spark/test_cluster.py's spark-submit job."""
    import re

    fmt = "tfrecord"
    data_dir = imagenet_dirs[0]
    out = tmp_path / "out"
    results = train.main([
        "--mode", "train", "--data-format", fmt, "--data-dir", data_dir, "--image-size", "32",
        "--classes", str(CLASSES), "--num-workers", "2", "--epochs", "2", "--batch-size", "8",
        "--warmup-epochs", "0.5", "--scaling", "--model-dir", str(tmp_path / "model"), "--output", str(out),
        "--verbose", "1",
    ])
    tr = results["train"]
    assert tr["num_workers"] == 2 and len(tr["history"]["loss"]) == 2
    assert np.isfinite(tr["history"]["loss"]).all()
    assert tr["img_per_sec"] > 0 and 0 <= tr["allreduce_share"] < 1
    assert tr["scaling_efficiency"] > 0 and tr["img_per_sec_1_rank"] > 0
    # the evaluation, recomputed apart: the exported net's logits on the 12 validation images, by numpy
    from tfnet import TFNet

    exported = TFNet.load(str(tmp_path / "model" / "export"))
    val = make_dataset(Source(fmt, data_dir, image_size=32, classes=CLASSES), "validation", batch=32, training=False)
    logits, labels = zip(*[(exported.forward(x), y.numpy()) for x, y in val])
    logits, labels = np.concatenate(logits), np.concatenate(labels)
    assert results["evaluate"]["images"] == len(labels) == 12
    assert results["evaluate"]["top1"] == pytest.approx(np.mean(logits.argmax(1) == labels), abs=1e-12)
    assert results["evaluate"]["top5"] == 1.0  # four classes: the label is always among the top five
    saved = json.loads((out / "results.json").read_text())
    assert saved["train"]["steps"] == tr["steps"]
    assert (out / "curves.png").stat().st_size > 1000
    assert os.path.exists(tmp_path / "model" / "export" / "frozen_inference_graph.pb")
    # the bar and the table: 36 training images, 4 steps of 2 x 4 an epoch
    captured = capsys.readouterr()
    shown = [float(v) for v in re.findall(r"samples_per_sec=([0-9.e+]+)", captured.err.split("epoch 2/2")[0])]
    assert len(tr["bar_img_per_sec"]) == 2
    assert tr["bar_img_per_sec"][0] == pytest.approx(shown[-1], rel=0.05), (tr["bar_img_per_sec"], shown)
    # steady: the global batch over the median of steps 3 to 8 (the compile and warm-up left out);
    # bar: an epoch's images over its steps' seconds, epoch 1's compile included
    times = tr["step_times"]
    assert len(times) == 8 and tr["steps"] == 8
    assert tr["img_per_sec"] == pytest.approx(8 / statistics.median(times[2:]), rel=1e-9)
    assert tr["bar_img_per_sec"] == pytest.approx([8 * 4 / sum(times[:4]), 8 * 4 / sum(times[4:])], rel=1e-9)
    table = (out / "results.txt").read_text()
    rows = {k.strip(): v.strip() for k, v in re.findall(r"^\| ([^|]+)\| ([^|]+) \|$", table, re.M)}
    assert rows["throughput, steady"] == f"{tr['img_per_sec']:.2f} img/s (median step)", table
    assert rows["throughput, bar epoch 1"] == f"{tr['bar_img_per_sec'][0]:.2f} img/s (with compile)", table
    assert rows["throughput, bar epoch 2"] == f"{tr['bar_img_per_sec'][1]:.2f} img/s", table


def test_throughput_leaves_the_first_steps_out():
    assert train._throughput([100.0, 50.0, 1.0, 2.0, 3.0], 8) == (4.0, 2.0)   # the median of steps 3 to 5
    assert train._throughput([100.0, 2.0, 4.0], 8) == (8 / 3.0, 3.0)          # of steps 2 and 3
    assert train._bar_throughput([3.0, 1.0, 1.0, 1.0], 2, 2) == [1.0, 2.0]


def test_compare_on_real_images_equals_keras_loss(imagenet_dirs, tmp_path):
    """The JPEG tree (random crops and flips): tfnet and Keras `fit` train ResNet-50 from the same
    weights on the same batches (the pipeline's first pass cached), so their losses per epoch agree
    to float32 rounding while the weights move."""
    results = train.main([
        "--mode", "compare", "--data-format", "jpeg", "--data-dir", imagenet_dirs[1], "--image-size", "32",
        "--classes", str(CLASSES), "--batch-size", "12", "--epochs", "2", "--output", str(tmp_path / "b"),
        "--verbose", "0",
    ])
    cmp_ = results["compare"]
    assert cmp_["tfnet"]["img_per_sec"] > 0 and cmp_["keras_fit"]["img_per_sec"] > 0
    assert cmp_["tfnet"]["steps"] == cmp_["keras_fit"]["steps"] == 6  # 36 images, 3 batches of 12, 2 epochs
    ours, keras_fit = cmp_["tfnet"]["loss"], cmp_["keras_fit"]["loss"]
    assert len(ours) == len(keras_fit) == 2 and ours[1] != ours[0]
    np.testing.assert_allclose(ours, keras_fit, rtol=1e-4)
    assert cmp_["loss_rel_diff"] == pytest.approx(max(abs(a - b) / b for a, b in zip(ours, keras_fit)))
    assert "loss, largest rel. difference" in (tmp_path / "b" / "results.txt").read_text()


def test_inference_and_evaluate_of_a_frozen_graph(imagenet_dirs, tmp_path):
    import keras

    from tfnet import TFNet

    model = keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=CLASSES)
    pb = tmp_path / "resnet.pb"
    net = TFNet.from_keras(model)
    pb.write_bytes(net.frozen_graph_def().SerializeToString())
    common = ["--frozen-graph", str(pb), "--input-name", net.input_names[0], "--output-name", net.output_names[0],
              "--image-size", "32", "--classes", str(CLASSES)]
    res = train.main(["--mode", "evaluate", "--data-format", "jpeg", "--data-dir", imagenet_dirs[1],
                      "--output", str(tmp_path / "e")] + common)
    assert res["evaluate"]["images"] == 12
    res = train.main(["--mode", "inference", "--synthetic", "--batch-size", "4", "--output", str(tmp_path / "i")] + common)
    assert res["inference"]["img_per_sec"] > 0
