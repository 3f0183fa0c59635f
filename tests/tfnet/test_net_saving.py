"""Saving: plain TensorFlow can use what TFNet writes, and loading it gives an identical layer."""

import json
import os

import numpy as np
import tensorflow as tf

from tests import models
from tfnet import TFNet


def assert_identical(a: TFNet, b: TFNet, x):
    assert a.input_names == b.input_names
    assert a.output_names == b.output_names
    assert a.weight_names == b.weight_names
    assert a.trainable == b.trainable
    assert a.statistic_names == b.statistic_names
    wa, wb = a.get_weights(), b.get_weights()
    for k in wa:
        np.testing.assert_array_equal(wa[k], wb[k])
    np.testing.assert_array_equal(a.forward(x), b.forward(x))


def test_save_then_plain_tensorflow_import(tmp_path):
    net = TFNet.from_keras(models.small_cnn())
    net.set_weights({"fc/bias": np.array([0.5, -0.5])})  # the saved graph has the current weights
    net.save(str(tmp_path / "m"))
    meta = json.loads((tmp_path / "m" / "graph_meta.json").read_text())
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString((tmp_path / "m" / "frozen_inference_graph.pb").read_bytes())
    x = models.random_images(4, 8)
    with tf.Graph().as_default() as g:
        tf.compat.v1.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=g) as sess:
            y = sess.run(meta["output_names"][0], {meta["input_names"][0]: x})
    np.testing.assert_allclose(y, net.forward(x), rtol=1e-6, atol=1e-6)


def test_save_load_round_trip_is_identical(tmp_path):
    graph_def, _ = models.tf1_graph()
    net = TFNet.from_frozen_graph(graph_def, "x", "logits")
    net.trainable = ["fc/w", "bn/mean"]
    net.apply_updates({"fc/w": np.full((4, 3), 0.01)})
    net.save(str(tmp_path / "m"))
    loaded = TFNet.load(str(tmp_path / "m"))
    assert_identical(net, loaded, np.random.default_rng(0).normal(size=(3, 6, 6, 2)))
    # saving over an existing folder replaces it
    net.apply_updates({"fc/w": np.full((4, 3), 0.01)})
    net.save(str(tmp_path / "m"))
    assert_identical(net, TFNet.load(str(tmp_path / "m")), np.ones((1, 6, 6, 2)))
    assert sorted(os.listdir(tmp_path / "m")) == ["frozen_inference_graph.pb", "graph_meta.json"]


def test_analytics_zoo_export_folder(tmp_path):
    """A folder with only input_names/output_names, as Analytics Zoo's export_tf wrote."""
    graph_def, oracle = models.tf1_graph()
    folder = tmp_path / "zoo"
    folder.mkdir()
    (folder / "frozen_inference_graph.pb").write_bytes(graph_def.SerializeToString())
    (folder / "graph_meta.json").write_text(json.dumps({"input_names": ["x:0"], "output_names": ["logits:0"]}))
    net = TFNet.from_export_folder(str(folder))
    x = np.random.default_rng(1).normal(size=(2, 6, 6, 2)).astype("float32")
    y, _, _ = oracle(x, np.zeros((2, 3), "float32"))
    np.testing.assert_allclose(net.forward(x), y, rtol=1e-5, atol=1e-6)


def test_saved_model_round_trip(tmp_path):
    model = models.two_in_two_out()
    net = TFNet.from_keras(model)
    net.save_saved_model(str(tmp_path / "sm"))
    a = np.random.default_rng(0).normal(size=(3, 5)).astype("float32")
    b = np.random.default_rng(1).normal(size=(3, 3)).astype("float32")
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    out = loaded.signatures["serving_default"](a=tf.constant(a), b=tf.constant(b))
    assert sorted(out) == ["y1", "y2"]
    ref = net.forward([a, b])
    np.testing.assert_allclose(out["y1"].numpy(), ref[0], rtol=1e-6)
    again = TFNet.from_saved_model(str(tmp_path / "sm"))
    assert sorted(again.weight_names) == sorted(net.weight_names)
    assert again.input_names == ["a:0", "b:0"]
    for x, y in zip(again.forward([a, b]), ref):
        np.testing.assert_allclose(x, y, rtol=1e-6)


def test_keras_saved_model_export(tmp_path):
    model = models.small_cnn()
    model.export(str(tmp_path / "exported"), verbose=False)
    net = TFNet.from_saved_model(str(tmp_path / "exported"))
    assert "fc/kernel" in net.weight_names
    x = models.random_images(2, 8)
    np.testing.assert_allclose(net.forward(x), model(x).numpy(), rtol=1e-5, atol=1e-6)
