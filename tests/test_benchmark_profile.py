"""benchmarks/profile_step.py reads TensorFlow's profile of tfnet's step: the kernels it counts a step are those of the
graph TensorFlow ran, as TensorFlow's own run metadata lists them (the partition graph, after Grappler and oneDNN's
layout pass), and C++ scopes of the trace (``ThreadpoolListener::Record``) are not kernels."""

import collections
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests import models
from tests.benchmark_files import load
from tfnet import TFNet

STEPS = 3


def test_the_kernels_a_step_are_those_of_the_graph_tensorflow_ran(monkeypatch):
    from tensorflow.python.eager import context

    monkeypatch.setattr(sys, "path", list(sys.path))  # the benchmarks put their folder first; not for later tests
    bench = load("profile_step")
    net = TFNet.from_keras(models.small_cnn(classes=3))
    sce = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    step = net.train_step(lambda t, o: sce(t, o), 0.01)
    x, y = tf.constant(models.random_images(16, 8, seed=1)), tf.constant(np.arange(16) % 3)
    state = step.init_state()
    context.enable_run_metadata()
    try:
        step(x, y, state)
        ran = context.export_run_metadata()
    finally:
        context.disable_run_metadata()
    (function,) = ran.function_graphs
    (graph,) = function.partition_graphs
    in_graph = collections.Counter(n.op for n in graph.node)

    space, seconds = bench.profile(lambda: step(x, y, state).loss.numpy(), STEPS)
    found = bench.breakdown(space, seconds, gflop_a_step=1.0, steps=STEPS)

    contractions = {op: n for op, n in found["op_counts"].items() if bench.is_contraction(op)}
    # the small CNN's convolution (forward, filter gradient) and dense layer (forward, two gradients), by the names
    # of the kernels that ran (oneDNN's where it is on): every one once a step
    assert contractions == {op: n for op, n in in_graph.items() if bench.is_contraction(op)}, (contractions, in_graph)
    assert sum(contractions.values()) == 5, contractions
    for op in ("ReluGrad", "BiasAddGrad", "SparseSoftmaxCrossEntropyWithLogits"):
        assert found["op_counts"][op] == in_graph[op] == 1, op
    assert set(found["op_counts"]) <= set(in_graph), set(found["op_counts"]) - set(in_graph)  # no C++ scope counted
    assert len(seconds) == STEPS and found["wall_s"] == sorted(seconds)[STEPS // 2]
    assert found["contractions_s"] > 0 and found["other_kernels_s"] > 0
    assert found["kernels_s"] == pytest.approx(sum(found["op_seconds"].values()), rel=1e-9)
    assert found["contraction_gflops"] == 1.0 / found["contractions_s"]
