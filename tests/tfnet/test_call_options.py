"""tfnet's compiled functions are instantiated without Grappler's GPU-only passes (layout, memory) on a machine
without GPUs, on top of the caller's own options, and nothing else's options change (tfnet.call_options)."""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2
from tensorflow.core.protobuf import rewriter_config_pb2 as rc
from tensorflow.python.eager import context

from tfnet import TFNet, call_options, precision
from tfnet.graph_function import own_function


def _rewrites() -> rc.RewriterConfig:
    config = config_pb2.ConfigProto()
    config.ParseFromString(context.context().function_call_options.config_proto_serialized)
    return config.graph_options.rewrite_options


def _traced_under(fn, *args):
    """The rewrite options in force while ``fn``, made an own_function, traced: the body runs inside its call."""
    seen = []

    def body(*a):
        seen.append(_rewrites())
        return fn(*a)

    own_function(body, autograph=False)(*args)
    return seen[0]


def test_this_machine_has_no_gpu():
    """The suite's machines have none; the checks below are about that case."""
    assert not tf.config.list_physical_devices("GPU")


def test_a_tfnet_function_is_instantiated_without_the_gpu_only_passes_and_the_thread_gets_its_options_back():
    before = context.context().function_call_options.config_proto_serialized
    seen = _traced_under(lambda x: x * 2.0, tf.constant(1.0))
    assert seen.layout_optimizer == rc.RewriterConfig.OFF
    assert seen.memory_optimization == rc.RewriterConfig.NO_MEM_OPT
    # the other passes stay at TensorFlow's defaults
    assert seen.remapping == rc.RewriterConfig.DEFAULT and seen.constant_folding == rc.RewriterConfig.DEFAULT
    assert context.context().function_call_options.config_proto_serialized == before
    assert _rewrites().layout_optimizer == rc.RewriterConfig.DEFAULT


def test_the_callers_options_are_kept_beneath():
    """Inside bf16_rewrite (tfnet's own per-thread options) the bf16 rewrite stays on; a pass the caller set
    explicitly (here the layout optimiser, ON) is the caller's."""
    with precision.bf16_rewrite():
        seen = _traced_under(lambda x: x + 1.0, tf.constant(1.0))
    assert seen.auto_mixed_precision_onednn_bfloat16 == rc.RewriterConfig.ON
    assert seen.layout_optimizer == rc.RewriterConfig.OFF
    ctx = context.context()
    before = ctx.function_call_options
    config = config_pb2.ConfigProto()
    config.graph_options.rewrite_options.layout_optimizer = rc.RewriterConfig.ON
    ctx.function_call_options = context.FunctionCallOptions(config_proto=config)
    try:
        seen = _traced_under(lambda x: x - 1.0, tf.constant(1.0))
    finally:
        ctx.function_call_options = before
    assert seen.layout_optimizer == rc.RewriterConfig.ON
    assert seen.memory_optimization == rc.RewriterConfig.NO_MEM_OPT


def test_with_a_gpu_nothing_changes(monkeypatch):
    monkeypatch.setattr(call_options, "_no_gpu", lambda: False)
    seen = _traced_under(lambda x: x * 3.0, tf.constant(1.0))
    assert seen.layout_optimizer == rc.RewriterConfig.DEFAULT
    assert seen.memory_optimization == rc.RewriterConfig.DEFAULT_MEM_OPT


def test_a_net_computes_the_same_bits_either_way(monkeypatch):
    """The two passes leave a CPU graph as they found it: forward, backward and a training step of a small CNN
    are bit for bit those of TensorFlow's default options (a second net, the passes on)."""
    import keras

    import optim

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3, activation="relu"),
                              keras.layers.BatchNormalization(), keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(3)])
    x = np.random.default_rng(0).normal(size=(4, 8, 8, 3)).astype(np.float32)
    y = np.array([0, 1, 2, 0])

    def run():
        net = TFNet.from_keras(model, train_batch_norm=True)
        out = net.forward(x)
        gx, gw = net.backward(x, np.ones_like(out))
        step = net.train_step(optim.losses.SparseCategoricalCrossentropy(from_logits=True), optim.SGD(0.1, momentum=0.9))
        step.set_state(step.init_state())
        loss = [float(step.run(x, y)[0]) for _ in range(2)]
        return [out, gx, *[gw[k] for k in sorted(gw)], np.array(loss), *[v for _, v in sorted(net.get_weights().items())]]

    without = run()
    monkeypatch.setattr(call_options, "_no_gpu", lambda: False)
    with_passes = run()
    for a, b in zip(without, with_passes, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("raises", [False, True])
def test_the_options_come_back_when_the_call_raises(raises):
    before = context.context().function_call_options.config_proto_serialized

    @tf.function(autograph=False)
    def fails(x):
        tf.debugging.assert_positive(x)
        return x

    fn = call_options.with_cpu_call_options(fails)
    if raises:
        with pytest.raises(tf.errors.InvalidArgumentError):
            fn(tf.constant(-1.0))
    else:
        fn(tf.constant(1.0))
    assert context.context().function_call_options.config_proto_serialized == before
