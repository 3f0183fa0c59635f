"""Losses against Keras' losses, metrics against scikit-learn and hand counts."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from sklearn.metrics import roc_auc_score

from optim import losses as L
from optim import metrics as M

rng = np.random.default_rng(0)
LOGITS = rng.normal(size=(16, 5)).astype("float32")
PROBS = tf.nn.softmax(LOGITS).numpy()
IDS = rng.integers(0, 5, 16)
ONEHOT = np.eye(5, dtype="float32")[IDS]
BIN = rng.integers(0, 2, (16, 1)).astype("float32")
BIN_P = rng.uniform(0.01, 0.99, (16, 1)).astype("float32")
REG_T = rng.normal(size=(16, 3)).astype("float32")
REG_P = rng.normal(size=(16, 3)).astype("float32") * 2

LOSSES = [
    ("sparse ce logits", L.SparseCategoricalCrossentropy(from_logits=True),
     keras.losses.SparseCategoricalCrossentropy(from_logits=True), IDS, LOGITS),
    ("sparse ce probs", L.get("sparse_categorical_crossentropy"), keras.losses.SparseCategoricalCrossentropy(), IDS, PROBS),
    ("ce logits", L.CategoricalCrossentropy(from_logits=True), keras.losses.CategoricalCrossentropy(from_logits=True),
     ONEHOT, LOGITS),
    ("ce probs", L.get("categorical_crossentropy"), keras.losses.CategoricalCrossentropy(), ONEHOT, PROBS),
    ("binary", L.get("binary_crossentropy"), keras.losses.BinaryCrossentropy(), BIN, BIN_P),
    ("binary logits", L.BinaryCrossentropy(from_logits=True), keras.losses.BinaryCrossentropy(from_logits=True),
     BIN, LOGITS[:, :1]),
    ("mse", L.get("mse"), keras.losses.MeanSquaredError(), REG_T, REG_P),
    ("mae", L.get("mae"), keras.losses.MeanAbsoluteError(), REG_T, REG_P),
    ("huber", L.Huber(0.7), keras.losses.Huber(0.7), REG_T, REG_P),
]


@pytest.mark.parametrize("name,ours,theirs,y,p", LOSSES, ids=[t[0] for t in LOSSES])
def test_loss_matches_keras(name, ours, theirs, y, p):
    ours.check_shapes(np.shape(y), np.shape(p))
    np.testing.assert_allclose(float(ours(tf.constant(y), tf.constant(p))), float(theirs(y, p)), rtol=1e-5)


def test_callable_and_keras_loss_objects():
    fn = L.get(lambda y, p: tf.reduce_mean(tf.abs(y - p)))
    assert float(fn(tf.constant(REG_T), tf.constant(REG_P))) == pytest.approx(float(L.get("mae")(REG_T, REG_P)), rel=1e-6)
    mapped = L.get(keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert isinstance(mapped, L.SparseCategoricalCrossentropy) and mapped.from_logits


def test_unknown_loss_and_bad_label_shapes():
    with pytest.raises(ValueError, match=r"Unknown loss 'cross_entropy'. Known losses: \["):
        L.get("cross_entropy")
    with pytest.raises(L.LabelShapeError, match=r"integer labels of shape \(batch,\) or \(batch, 1\).*received labels \(16, 5\)"):
        L.get("sparse_categorical_crossentropy").check_shapes((16, 5), (16, 5))
    with pytest.raises(L.LabelShapeError, match=r"labels shaped like the predictions \(16, 5\); received labels of shape \(16,\)"):
        L.get("categorical_crossentropy").check_shapes((16,), (16, 5))
    with pytest.raises(TypeError, match="A loss is a name"):
        L.get(3)


def test_accuracy_kinds():
    for labels in (IDS, IDS[:, None], ONEHOT):
        m = M.get("accuracy")
        m.update(labels, LOGITS)
        assert m.result() == pytest.approx((LOGITS.argmax(1) == IDS).mean())
    m = M.Accuracy()
    m.update(BIN, BIN_P)
    assert m.result() == pytest.approx(((BIN_P > 0.5) == BIN).mean())


def test_top_k_and_errors():
    m = M.get("top3_accuracy")
    m.update(IDS, LOGITS)
    top3 = np.argsort(-LOGITS, axis=1)[:, :3]
    assert m.result() == pytest.approx(np.mean([IDS[i] in top3[i] for i in range(16)]))
    e1, e2 = M.get("mae"), M.get("mse")
    e1.update(REG_T, REG_P)
    e2.update(REG_T, REG_P)
    assert e1.result() == pytest.approx(np.abs(REG_T - REG_P).mean(), rel=1e-6)
    assert e2.result() == pytest.approx(np.square(REG_T - REG_P).mean(), rel=1e-6)


def test_auc_matches_sklearn_and_merges():
    labels = rng.integers(0, 2, 5000)
    scores = np.clip(labels * 0.3 + rng.normal(0.35, 0.2, 5000), 0, 1)
    whole = M.AUC()
    whole.update(labels, scores)
    assert whole.result() == pytest.approx(roc_auc_score(labels, scores), abs=2e-3)
    a, b = M.AUC(), M.AUC()
    a.update(labels[:2000], scores[:2000])
    b.update(labels[2000:], scores[2000:])
    a.merge(b.state)
    assert a.result() == pytest.approx(whole.result(), abs=1e-12)


def test_callable_metric_and_unknown_name():
    m = M.get(lambda y, p: tf.reduce_mean(tf.cast(tf.equal(tf.argmax(p, 1), y), tf.float32)))
    m.update(IDS, LOGITS)
    m.update(IDS[:4], LOGITS[:4])
    expected = ((LOGITS.argmax(1) == IDS).sum() + (LOGITS[:4].argmax(1) == IDS[:4]).sum()) / 20
    assert m.result() == pytest.approx(expected)
    with pytest.raises(ValueError, match=r"Unknown metric 'f1'"):
        M.get("f1")
