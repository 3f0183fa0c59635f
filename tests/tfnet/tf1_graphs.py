"""Small TF1 graphs built in a ``tf.Graph``, trained in a v1 ``Session`` as the oracle, and frozen
with TensorFlow's own ``tf.compat.v1.graph_util.convert_variables_to_constants``."""

from __future__ import annotations

import os
from contextlib import contextmanager

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import control_flow_util

from tests.tfnet.fidelity import Case, Oracle

v1 = tf.compat.v1


@contextmanager
def control_flow(version: int):
    """Builds ``tf.while_loop`` / ``tf.cond`` as v1 (Enter/Exit/Switch/Merge) or v2 (While/If) ops."""
    was = control_flow_util.ENABLE_CONTROL_FLOW_V2
    control_flow_util.ENABLE_CONTROL_FLOW_V2 = version == 2
    try:
        yield
    finally:
        control_flow_util.ENABLE_CONTROL_FLOW_V2 = was


def rnn(batch=2, steps=5, features=3, hidden=4):
    """``h = tanh(x_t W + h U + b)`` over ``steps`` with ``tf.while_loop``, then ``y = h V``."""
    x = v1.placeholder(tf.float32, [None, steps, features], name="x")
    w = v1.get_variable("W", [features, hidden])
    u = v1.get_variable("U", [hidden, hidden])
    b = v1.get_variable("b", [hidden], initializer=v1.random_normal_initializer(0, 0.1))
    v = v1.get_variable("V", [hidden, 2])
    h0 = tf.zeros(tf.stack([tf.shape(x)[0], hidden]))

    def body(t, h):
        return t + 1, tf.tanh(tf.matmul(x[:, t], w) + tf.matmul(h, u) + b)

    _, h = tf.while_loop(lambda t, h: t < steps, body, [tf.constant(0), h0])
    y = tf.identity(tf.matmul(h, v), name="y")
    feed = np.random.default_rng(0).normal(size=(batch, steps, features)).astype(np.float32)
    return x, y, feed


def cond(batch=2, features=3):
    """``tf.cond`` on the data: one weight matrix when the row sum is positive, another otherwise."""
    x = v1.placeholder(tf.float32, [None, features], name="x")
    w1 = v1.get_variable("W1", [features, 2])
    w2 = v1.get_variable("W2", [features, 2])
    y = tf.cond(tf.reduce_sum(x) > 0, lambda: tf.matmul(x, w1), lambda: tf.matmul(x, w2) * 2.0)
    y = tf.identity(y, name="y")
    feed = np.abs(np.random.default_rng(1).normal(size=(batch, features))).astype(np.float32)
    return x, y, feed


def fused_batch_norm(batch=2):
    """Conv, then inference-mode ``FusedBatchNormV3`` whose mean and variance are not trained."""
    x = v1.placeholder(tf.float32, [None, 6, 6, 3], name="x")
    k = v1.get_variable("conv/kernel", [3, 3, 3, 4])
    gamma = v1.get_variable("bn/gamma", [4], initializer=v1.random_uniform_initializer(0.5, 1.5))
    beta = v1.get_variable("bn/beta", [4], initializer=v1.random_normal_initializer(0, 0.1))
    mean = v1.get_variable("bn/mean", [4], initializer=v1.random_normal_initializer(0, 0.1), trainable=False)
    var = v1.get_variable("bn/var", [4], initializer=v1.random_uniform_initializer(0.5, 1.5), trainable=False)
    h = tf.nn.conv2d(x, k, 1, "SAME")
    h, _, _ = v1.nn.fused_batch_norm(h, gamma, beta, mean, var, is_training=False)
    y = tf.identity(tf.reduce_mean(tf.nn.relu(h), axis=[1, 2]), name="y")
    feed = np.random.default_rng(2).normal(size=(batch, 6, 6, 3)).astype(np.float32)
    return x, y, feed


def embedding(batch=2):
    """``embedding_lookup`` of integer ids, mean over the sequence, then a dense layer."""
    ids = v1.placeholder(tf.int32, [None, 4], name="ids")
    table = v1.get_variable("embedding", [10, 3])
    w = v1.get_variable("dense/W", [3, 2])
    y = tf.identity(tf.matmul(tf.reduce_mean(tf.nn.embedding_lookup(table, ids), axis=1), w), name="y")
    feed = np.array([[1, 2, 3, 2], [9, 0, 0, 5]][:batch], np.int32)
    return ids, y, feed


def string_input(batch=2):
    """Comma-separated numbers parsed in the graph (``tf.strings``), then a dense layer."""
    s = v1.placeholder(tf.string, [None], name="csv")
    numbers = tf.strings.to_number(tf.strings.split(s, ",").to_tensor(default_value="0"))
    w = v1.get_variable("dense/W", [3, 2])
    b = v1.get_variable("dense/b", [2], initializer=v1.random_normal_initializer(0, 0.1))
    y = tf.identity(tf.matmul(tf.reshape(numbers, [-1, 3]), w) + b, name="y")
    feed = np.array([b"1.5,-2,0.25", b"3,0.5,-1"][:batch], object)
    return s, y, feed


BUILDERS = {
    "rnn_while_v1": (rnn, 1),
    "rnn_while_v2": (rnn, 2),
    "cond_v2": (cond, 2),
    "cond_v1": (cond, 1),
    "fused_batch_norm": (fused_batch_norm, 2),
    "embedding_lookup": (embedding, 2),
    "string_input": (string_input, 2),
}


def freeze_tf1(name: str, tmp: str, seed: int = 0) -> Case:
    """Builds the graph, computes the Session oracle and freezes it with the v1 converter."""
    build, version = BUILDERS[name]
    graph = tf.Graph()
    with graph.as_default(), control_flow(version):
        v1.set_random_seed(seed)
        x, y, feed = build()
        grad_out = np.random.default_rng(seed).normal(size=(len(feed), *y.shape[1:])).astype(np.float64)
        trainable = v1.trainable_variables()
        float_weights = [v for v in v1.global_variables() if v.dtype.base_dtype.is_floating]
        obj = tf.reduce_sum(y * tf.constant(grad_out, tf.float32))
        sources = ([x] if x.dtype.is_floating else []) + trainable
        grads = [tf.convert_to_tensor(g) for g in tf.gradients(obj, sources)]
        lr = v1.placeholder(tf.float32, [])
        step = [v.assign_sub(lr * g) for v, g in zip(trainable, grads[-len(trainable):])]
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            y0, g = sess.run([y, grads], {x: feed})
            graph_def = v1.graph_util.convert_variables_to_constants(sess, graph.as_graph_def(), [y.op.name])
            rate = 0.01 / max(float(np.abs(a).max()) for a in g[-len(trainable):])
            sess.run(step, {x: feed, lr: rate})
            y1 = sess.run(y, {x: feed})
    names = [v.op.name for v in trainable]
    oracle = Oracle(
        x=feed, grad_out=grad_out, y=y0, grad_x=g[0] if x.dtype.is_floating else None,
        grad_w=dict(zip(names, g[-len(trainable):])), lr=rate, y_after_step=y1, trainable=set(names),
        frozen={v.op.name for v in float_weights} - set(names),
    )
    pb = os.path.join(tmp, f"{name}.pb")
    with open(pb, "wb") as f:
        f.write(graph_def.SerializeToString())
    return Case(name, "converter", pb, [x.name], [y.name], oracle)
