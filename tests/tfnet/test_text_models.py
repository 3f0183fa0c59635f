"""Text models (issue 33, point 4): graphs with lookup tables (TextVectorization, StringLookup,
IntegerLookup, Hashing, a TF1 vocabulary file) load from Keras, .keras files, SavedModels and frozen
graphs, keep their tables through every save and load, and match Keras on strings. The Spark half
(fine-tuning on a string column, TFPredictor) is tests/optim/spark/test_text_spark.py."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfnet import GraphLoadError, TFNet


def text_model(seed: int = 0):
    """A sentence, a tag and an integer code in; a lookup per layer kind; two scores out."""
    keras.utils.set_random_seed(seed)
    words = keras.Input((), dtype="string", name="words")
    tag = keras.Input((), dtype="string", name="tag")
    code = keras.Input((), dtype="int64", name="code")
    vectorize = keras.layers.TextVectorization(max_tokens=20, output_sequence_length=5, name="vectorize")
    vectorize.adapt(["the cat sat on the mat", "a dog ran far", "the dog sat"])
    tags = keras.layers.StringLookup(vocabulary=["red", "green", "blue"], name="tags")
    codes = keras.layers.IntegerLookup(vocabulary=[10, 20, 30], name="codes")
    hashed = keras.layers.Hashing(8, name="hashed")
    seq = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(20, 4, name="embed")(vectorize(words)))
    parts = [seq, keras.layers.CategoryEncoding(4, output_mode="one_hot")(tags(tag)),
             keras.layers.CategoryEncoding(4, output_mode="one_hot")(codes(code)),
             keras.layers.CategoryEncoding(8, output_mode="one_hot")(hashed(words))]
    out = keras.layers.Dense(2, name="scores")(keras.layers.Concatenate()(parts))
    return keras.Model([words, tag, code], out)


WORDS = np.array([b"the cat sat", b"a dog ran far", b"zebra crossing", b"", b"dog the mat"], object)
TAGS = np.array([b"red", b"blue", b"mauve", b"green", b""], object)
CODES = np.array([20, 10, 99, 30, 10], np.int64)


def keras_out(model):
    return model([tf.constant(WORDS), tf.constant(TAGS), tf.constant(CODES)]).numpy()


def forward(net):
    return net.forward({"words": WORDS, "tag": TAGS, "code": CODES})


def test_keras_text_model_matches_keras_and_keeps_its_tables_through_every_format(tmp_path):
    model = text_model()
    want = keras_out(model)
    net = TFNet.from_keras(model)
    np.testing.assert_allclose(forward(net), want, rtol=1e-6, atol=1e-6)
    assert net.output_names == ["scores:0"] and net.input_names == ["words:0", "tag:0", "code:0"]
    assert sorted(net.weight_names) == ["embed/embeddings", "scores/bias", "scores/kernel"]  # tables are not weights
    frozen = net.frozen_graph_def()
    assert sum(n.op == "HashTableV2" for n in frozen.node) == 3  # TextVectorization, StringLookup, IntegerLookup
    assert sum(n.op == "InitializeTableV2" for n in frozen.node) == 3
    # a frozen graph (bytes, as a .pb holds them), an export folder, a SavedModel, .keras, Keras's own export
    loaded = {
        "frozen graph": TFNet.from_frozen_graph(frozen.SerializeToString(), net.input_names, net.output_names),
    }
    net.save(tmp_path / "export")
    loaded["export folder"] = TFNet.load(tmp_path / "export")
    net.save_saved_model(str(tmp_path / "tfnet_saved"))
    loaded["tfnet's SavedModel"] = TFNet.from_saved_model(str(tmp_path / "tfnet_saved"))
    model.save(tmp_path / "model.keras")
    loaded[".keras file"] = TFNet.from_keras(str(tmp_path / "model.keras"))
    model.export(str(tmp_path / "keras_export"), verbose=False)
    loaded["Keras's export"] = TFNet.from_saved_model(str(tmp_path / "keras_export"))
    for what, other in loaded.items():
        np.testing.assert_allclose(forward(other), want, rtol=1e-6, atol=1e-6, err_msg=what)
    # a TF1 session runs the frozen graph after init_all_tables, as any TF1 graph with tables
    with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as sess:
        tf.graph_util.import_graph_def(frozen, name="")
        sess.run("init_all_tables")
        got = sess.run("scores:0", {"words:0": WORDS, "tag:0": TAGS, "code:0": CODES})
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_text_model_trains_through_its_tables():
    """The gradient of the embedding reaches the rows the lookup picked, as Keras's does."""
    model = text_model(seed=3)
    net = TFNet.from_keras(model)
    ones = np.ones((len(WORDS), 2), np.float32)
    _, grads = net.backward({"words": WORDS, "tag": TAGS, "code": CODES}, ones)
    with tf.GradientTape() as tape:
        out = model([tf.constant(WORDS), tf.constant(TAGS), tf.constant(CODES)])
    keras_grads = tape.gradient(out, model.trainable_variables, output_gradients=tf.constant(ones))
    by_path = {v.path: g for v, g in zip(model.trainable_variables, keras_grads)}
    np.testing.assert_allclose(np.asarray(tf.convert_to_tensor(grads["embed/embeddings"])),
                               tf.convert_to_tensor(by_path["embed/embeddings"]).numpy(), rtol=1e-5, atol=1e-6)


def test_a_tf_module_saved_model_with_a_static_hash_table(tmp_path):
    class Scorer(tf.Module):
        def __init__(self):
            self.table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(tf.constant(["low", "high"]), tf.constant([1.0, 3.0])), -1.0)
            self.scale = tf.Variable([2.0])

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="level")])
        def score(self, level):
            return {"score": self.table.lookup(level) * self.scale}

    scorer = Scorer()
    tf.saved_model.save(scorer, str(tmp_path / "scorer"), signatures={"serving_default": scorer.score})
    net = TFNet.from_saved_model(str(tmp_path / "scorer"))
    levels = np.array([b"high", b"low", b"unknown"], object)
    np.testing.assert_allclose(net.forward(levels), scorer.score(tf.constant(levels))["score"].numpy())
    assert [w.tolist() for w in net.get_weights().values()] == [[2.0]]  # the table's float values are not a weight


def test_a_tf1_graph_with_a_vocabulary_file(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("the\ncat\ndog\n")
    graph = tf.Graph()
    with graph.as_default():
        words = tf.compat.v1.placeholder(tf.string, [None], name="words")
        init = tf.compat.v1.lookup.TextFileInitializer(str(vocab), tf.string, tf.compat.v1.lookup.TextFileIndex.WHOLE_LINE,
                                                       tf.int64, tf.compat.v1.lookup.TextFileIndex.LINE_NUMBER)
        ids = tf.compat.v1.lookup.StaticHashTable(init, -1).lookup(words)
        table = tf.constant(np.arange(8, dtype=np.float32).reshape(4, 2), name="embedding")
        tf.gather(table, ids + 1, name="vector")
    net = TFNet.from_frozen_graph(graph.as_graph_def(), "words", "vector")
    want = [[4.0, 5.0], [0.0, 1.0], [6.0, 7.0]]  # cat (id 1), unknown (-1), dog (2)
    np.testing.assert_array_equal(net.forward(np.array([b"cat", b"emu", b"dog"], object)), want)
    assert net.weight_names == ["embedding"]
    os.remove(vocab)  # the file was read once, when the graph loaded: the frozen graph holds the vocabulary
    again = TFNet.from_frozen_graph(net.frozen_graph_def(), "words", "vector")
    np.testing.assert_array_equal(again.forward(np.array([b"cat", b"emu", b"dog"], object)), want)
    with pytest.raises(GraphLoadError, match=r"The graph's lookup tables could not be filled: .*vocab.txt.* \(a "
                                             r"vocabulary file that is not where the graph says\?\)"):
        TFNet.from_frozen_graph(graph.as_graph_def(), "words", "vector")


def test_from_keras_takes_a_file_path(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,), name="x"), keras.layers.Dense(2, name="logits")])
    x = np.random.RandomState(0).randn(4, 3).astype("float32")
    model.save(tmp_path / "m.keras")
    model.save(tmp_path / "m.h5")
    for path in (tmp_path / "m.keras", str(tmp_path / "m.h5")):
        np.testing.assert_allclose(TFNet.from_keras(path).forward(x), model.predict(x, verbose=0), rtol=1e-6)
    with pytest.raises(FileNotFoundError, match=r"No Keras model file at '.*missing.keras'"):
        TFNet.from_keras(str(tmp_path / "missing.keras"))
    (tmp_path / "not_a_model.keras").write_bytes(b"not a zip file")
    with pytest.raises(GraphLoadError, match=r"Keras could not load '.*not_a_model.keras' as a model .*for a "
                                             r"SavedModel folder use TFNet.from_saved_model"):
        TFNet.from_keras(tmp_path / "not_a_model.keras")
    model.export(str(tmp_path / "saved"), verbose=False)
    with pytest.raises(GraphLoadError, match=r"it is a SavedModel folder: use TFNet.from_saved_model\(path\)"):
        TFNet.from_keras(str(tmp_path / "saved"))


def test_sequential_outputs_are_named_after_their_last_layer():
    model = keras.Sequential([keras.Input((3,), name="pixels"), keras.layers.Dense(4, name="hidden"),
                              keras.layers.Dense(2, name="logits")])
    net = TFNet.from_keras(model)
    assert net.input_names == ["pixels:0"] and net.output_names == ["logits:0"]
    assert "logits:0" in net.tensor_names() and "hidden:0" in net.tensor_names()  # both cut points
    body = net.cut("hidden")
    x = np.ones((1, 3), np.float32)
    np.testing.assert_allclose(body.forward(x), model.layers[0](x).numpy(), rtol=1e-6)
