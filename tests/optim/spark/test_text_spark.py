"""A text model over Spark (issue 33, point 4): a Keras model with TextVectorization fine-tunes on a
string column over two Horovod ranks, learns a small sentiment task the test writes, and
TFPredictor scores a string column as ``net.forward`` does (TensorFlow backend; OpenVINO says it
cannot and falls back). Real local[2] Spark."""

import keras
import numpy as np
import pytest

import optim
from optim import TFDataset, TFOptimizer, TFPredictor
from optim.errors import BackendFallbackWarning
from tfnet import TFNet

pytestmark = [pytest.mark.spark, pytest.mark.parallel]

POSITIVE, NEGATIVE = ["good", "great", "fine", "nice"], ["bad", "awful", "poor", "sad"]
FILLER = ["the", "movie", "was", "plot", "a", "and", "acting"]


def reviews(n: int, seed: int = 0):
    """Sentences of filler words and a few positive and negative ones; positive when there are more
    positive words."""
    rng = np.random.RandomState(seed)
    texts, labels = [], []
    mixes = [(0, 1), (1, 0), (2, 1), (1, 2), (2, 0), (0, 2)]
    for _ in range(n):
        p, q = mixes[rng.randint(len(mixes))]
        words = list(rng.choice(FILLER, 4)) + list(rng.choice(POSITIVE, p)) + list(rng.choice(NEGATIVE, q))
        rng.shuffle(words)
        texts.append(" ".join(words))
        labels.append(float(p > q))
    return np.array(texts, object), np.array(labels)


def sentiment_net(texts):
    keras.utils.set_random_seed(0)
    vectorize = keras.layers.TextVectorization(max_tokens=32, output_sequence_length=8, name="vectorize")
    vectorize.adapt(texts.astype(str))
    text = keras.Input((), dtype="string", name="text")
    pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(32, 8, name="embed")(vectorize(text)))
    model = keras.Model(text, keras.layers.Dense(1, activation="sigmoid", name="positive")(pooled))
    return TFNet.from_keras(model)


def test_a_text_model_fine_tunes_on_a_string_column_and_predicts(spark, tmp_path):
    texts, labels = reviews(400)
    net = sentiment_net(texts[:300])
    held, held_labels = texts[300:], labels[300:]
    before = float(np.mean((net.forward(held)[:, 0] > 0.5) == held_labels))
    df = spark.createDataFrame([(i, str(texts[i]), float(labels[i])) for i in range(300)],
                               "id long, text string, label double").repartition(2)
    opt = TFOptimizer(net, "binary_crossentropy", optim.Adam(0.05), metrics=["accuracy"])
    history = opt.optimize(TFDataset.from_dataframe(df, "text", "label"), epochs=6, batch_size=32, num_workers=2,
                           verbose=0)
    after = float(np.mean((net.forward(held)[:, 0] > 0.5) == held_labels))
    assert after >= 0.95 and after > before + 0.2, (before, after, history)
    # TFPredictor on a string column equals net.forward; saved and loaded, the net still does
    test = spark.createDataFrame([(i, str(held[i])) for i in range(len(held))], "id long, text string").repartition(2)
    rows = TFPredictor(net, batch_per_thread=16).predict(test, feature_cols="text").orderBy("id").collect()
    np.testing.assert_allclose(np.array([r.output for r in rows]), net.forward(held), rtol=1e-6, atol=1e-6)
    net.save(tmp_path / "export")
    np.testing.assert_allclose(TFNet.load(tmp_path / "export").forward(held), net.forward(held), rtol=1e-6)
    with pytest.warns(BackendFallbackWarning, match=r"string inputs or outputs \['text:0'\] are not supported"):
        fallback = TFPredictor(tmp_path / "export", backend="openvino")
    assert fallback.backend == "tensorflow"
    np.testing.assert_allclose(fallback.predict(held), net.forward(held), rtol=1e-6)


def test_keras_docs_input_of_shape_1_from_a_string_and_a_double_column(spark):
    """Keras's own text example, ``keras.Input(shape=(1,), dtype="string")`` then TextVectorization, fed from a plain
    string column over two ranks, and a numeric ``keras.Input((1,))`` fed from a double column: a column of one
    value per row feeds an input of per-row shape ``(1,)``, as Keras's ``fit`` takes such arrays. TFPredictor and
    ``evaluate`` take the same columns; ``net.forward`` takes the ``(n,)`` arrays."""
    texts, labels = reviews(300)
    keras.utils.set_random_seed(0)
    vectorize = keras.layers.TextVectorization(max_tokens=32, output_sequence_length=8, name="vectorize")
    vectorize.adapt(texts.astype(str))
    text = keras.Input(shape=(1,), dtype="string", name="text")
    pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(32, 8)(vectorize(text)))
    net = TFNet.from_keras(keras.Model(text, keras.layers.Dense(1, activation="sigmoid")(pooled)))
    df = spark.createDataFrame([(str(texts[i]), float(labels[i])) for i in range(300)], "text string, label double")
    opt = TFOptimizer(net, "binary_crossentropy", optim.Adam(0.05), metrics=["accuracy"])
    data = TFDataset.from_dataframe(df.repartition(2), "text", "label")
    history = opt.optimize(data, epochs=4, batch_size=32, num_workers=2, verbose=0)
    assert history["accuracy"][-1] > 0.9, history
    assert opt.evaluate(data)["accuracy"] == pytest.approx(
        float(np.mean((net.forward(texts)[:, 0] > 0.5) == labels)), abs=1e-6)
    scored = TFPredictor(net, batch_per_thread=16).predict(df.limit(20), feature_cols="text").collect()
    np.testing.assert_allclose(np.array([r.output for r in scored]), net.forward(texts[:20]), rtol=1e-6, atol=1e-6)
    # a number per row for Input((1,)): y = 3x - 1, learnt over two ranks from a double column
    keras.utils.set_random_seed(0)
    line = TFNet.from_keras(keras.Sequential([keras.Input((1,), name="x"), keras.layers.Dense(1, name="y")]))
    xs = np.linspace(-1, 1, 256)
    numbers = spark.createDataFrame([(float(v), float(3 * v - 1)) for v in xs], "x double, y double").repartition(2)
    fit = TFOptimizer(line, "mse", optim.SGD(0.5))
    fit.optimize(TFDataset.from_dataframe(numbers, "x", "y"), epochs=8, batch_size=32, num_workers=2, verbose=0)
    np.testing.assert_allclose(line.forward(np.array([0.0, 1.0], np.float32))[:, 0], [-1.0, 2.0], atol=0.05)
