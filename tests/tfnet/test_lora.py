"""Low-rank adapters on frozen graphs (``TFNet.with_lora``): Keras 3's own LoRA as the oracle (``Dense``
and ``MultiHeadAttention``'s ``EinsumDense`` projections), PyTorch-layout kernels of an ONNX export
against the formula in numpy, the adapters through cut, add_head, hooks, serialization and saving,
and the errors."""

import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.tfnet.onnx_fixtures import path_of
from tfnet import TFNet, WeightError
from tfnet.serialize import net_from_bytes, net_to_bytes

RNG = np.random.default_rng(0)


def mse(t, o):
    return tf.reduce_mean(tf.square(t - o))


def keras_path(tfnet_name: str) -> str:
    """tfnet's adapter name for Keras's LoRA variable path: ``d1/kernel/lora_a`` <- ``d1/lora_kernel_a``."""
    return re.sub(r"/kernel/lora_(a|b)$", r"/lora_kernel_\1", tfnet_name)


def random_adapters(lora, model_layers, rng):
    """The same random A and B (B non-zero, so the forward pass tests the product) in tfnet and Keras."""
    values = {}
    for target, adapter in lora.adapters.items():
        layer = model_layers[target]
        for name, var in ((adapter.a, layer.lora_kernel_a), (adapter.b, layer.lora_kernel_b)):
            assert tuple(var.shape) == tuple(lora.weight_variables[name].shape), name
            values[name] = rng.normal(0, 0.3, var.shape).astype("float32")
            var.assign(values[name])
    lora.set_weights(values)


def train_both(model, lora, batches, rate):
    """SGD on the same batches: Keras's ``train_on_batch`` and tfnet's fused step, over the same
    trainable set (Keras trains the biases beside the LoRA kernels)."""
    lora.trainable = [n for n in lora.weight_names if keras_path(n) in {v.path for v in model.trainable_variables}]
    assert len(lora.trainable) == len(model.trainable_variables)
    model.compile(optimizer=keras.optimizers.SGD(rate), loss="mse", jit_compile=False)
    step = lora.train_step(mse, rate)
    for x, y in batches:
        model.train_on_batch(x, y)
        step.run(x, y)
    return {v.path: v.numpy() for v in model.trainable_variables}


# ---------------------------------------------------------------- Keras as the oracle


def test_dense_lora_matches_keras_forward_and_after_20_sgd_steps():
    """Keras 3.15's ``Dense.enable_lora(rank, lora_alpha)``: ``kernel + alpha / rank * A @ B``, kernel frozen.
    (``Dense(lora_rank=r, lora_alpha=a)`` in the constructor loses ``a`` in Keras 3.15.1: its ``build``
    calls ``enable_lora(r)``, which resets alpha to r; so LoRA is enabled after building.)"""
    rank, alpha = 2, 6.0
    keras.utils.set_random_seed(3)
    inp = keras.Input((6,), name="x")
    h = keras.layers.Dense(8, activation="tanh", name="d1")(inp)
    model = keras.Model(inp, keras.layers.Dense(3, name="d2")(h))
    net = TFNet.from_keras(model)  # the model without LoRA, frozen
    layers = {"d1/kernel": model.get_layer("d1"), "d2/kernel": model.get_layer("d2")}
    for layer in layers.values():
        layer.enable_lora(rank, lora_alpha=alpha)
        assert layer.lora_alpha == alpha
    kernels = {n: layer._kernel.numpy() for n, layer in layers.items()}  # .kernel would add A @ B

    lora = net.with_lora(["d1/kernel", "d2/kernel"], rank=rank, alpha=alpha, seed=0)
    assert lora.trainable == ["d1/kernel/lora_a", "d1/kernel/lora_b", "d2/kernel/lora_a", "d2/kernel/lora_b"]
    x = RNG.normal(size=(16, 6)).astype("float32")
    np.testing.assert_array_equal(lora.forward(x), net.forward(x))  # B starts at zero
    random_adapters(lora, layers, np.random.default_rng(1))
    np.testing.assert_allclose(lora.forward(x), model(x).numpy(), rtol=1e-6, atol=1e-6)
    assert np.abs(lora.forward(x) - net.forward(x)).max() > 0.1

    batches = [(RNG.normal(size=(8, 6)).astype("float32"), RNG.normal(size=(8, 3)).astype("float32"))
               for _ in range(20)]
    want = train_both(model, lora, batches, rate=0.1)
    got = lora.get_weights()
    for name in lora.trainable:
        np.testing.assert_allclose(got[name], want[keras_path(name)], atol=1e-5, err_msg=name)
    for name, layer in layers.items():
        np.testing.assert_array_equal(got[name], kernels[name])  # the base kernels stay frozen on both sides
        np.testing.assert_array_equal(layer._kernel.numpy(), kernels[name])
    np.testing.assert_allclose(lora.forward(x), model(x).numpy(), rtol=1e-5, atol=1e-5)


def test_attention_projections_match_keras_einsum_dense_lora():
    """``MultiHeadAttention``'s query, key, value and output ``EinsumDense`` kernels (rank 3, read through a
    reshape and a matmul in the frozen graph): A of shape ``kernel.shape[:-1] + (rank,)``, as Keras's."""
    rank = 3
    keras.utils.set_random_seed(4)
    inp = keras.Input((5, 8), name="x")
    mha = keras.layers.MultiHeadAttention(2, 4, name="mha")
    model = keras.Model(inp, mha(inp, inp))
    net = TFNet.from_keras(model)
    assert net.lora_candidates() == ["mha/query/kernel", "mha/key/kernel", "mha/value/kernel",
                                     "mha/attention_output/kernel"]
    parts = {"query": mha.query_dense, "key": mha.key_dense, "value": mha.value_dense,
             "attention_output": mha.output_dense}
    layers = {f"mha/{k}/kernel": layer for k, layer in parts.items()}
    for layer in layers.values():
        layer.enable_lora(rank)

    lora = net.with_lora(re.compile(r"^mha/"), rank=rank, seed=0)  # skips the biases
    assert list(lora.adapters) == list(layers)
    assert lora.weight_variables["mha/query/kernel/lora_a"].shape == (8, 2, rank)
    assert lora.weight_variables["mha/attention_output/kernel/lora_b"].shape == (rank, 8)
    random_adapters(lora, layers, np.random.default_rng(2))
    x = RNG.normal(size=(4, 5, 8)).astype("float32")
    np.testing.assert_allclose(lora.forward(x), model(x).numpy(), rtol=1e-5, atol=1e-5)

    batches = [(RNG.normal(size=(4, 5, 8)).astype("float32"), RNG.normal(size=(4, 5, 8)).astype("float32"))
               for _ in range(5)]
    want = train_both(model, lora, batches, rate=0.05)
    got = lora.get_weights()
    for name in lora.trainable:
        np.testing.assert_allclose(got[name], want[keras_path(name)], atol=1e-5, err_msg=name)


# ---------------------------------------------------------------- PyTorch's (out, in) kernels


def test_onnx_linear_kernels_take_adapters_in_their_in_out_sense():
    """PyTorch's ``Linear`` stores W as (out, in); the ONNX export reads it through ``Transpose`` or
    ``MatMul(transpose_b=True)``. The adapter still has A (in, rank) and B (rank, out), and the net equals
    the base with ``W + alpha / rank * (A @ B)^T`` set in numpy."""
    base = TFNet.from_onnx(path_of("transformer")).cut("logits")
    assert base.lora_candidates() == ["embed.weight", "layer.self_attn.in_proj_weight",
                                      "layer.self_attn.out_proj.weight", "layer.linear1.weight",
                                      "layer.linear2.weight", "head.weight"]
    lora = base.with_lora(re.compile(r"^layer\."), rank=4, alpha=8, seed=0)
    layouts = {t: ad.layout for t, ad in lora.adapters.items()}
    assert layouts == dict.fromkeys(["layer.self_attn.in_proj_weight", "layer.self_attn.out_proj.weight",
                                     "layer.linear1.weight", "layer.linear2.weight"], "transposed")
    assert lora.weight_variables["layer.linear1.weight/lora_a"].shape == (32, 4)  # in = 32
    assert lora.weight_variables["layer.linear1.weight/lora_b"].shape == (4, 64)  # out = 64
    rng = np.random.default_rng(5)
    lora.set_weights({n: rng.normal(0, 0.2, lora.weight_variables[n].shape) for n in lora.adapter_names})
    w = lora.get_weights()
    folded = {t: w[t] + 2.0 * (w[ad.a] @ w[ad.b]).T for t, ad in lora.adapters.items()}
    reference = base.cut("logits")
    reference.set_weights(folded)
    ids = rng.integers(0, 50, (6, 8)).astype("int64")
    mask = (rng.random((6, 8)) > 0.2).astype("float32")
    np.testing.assert_allclose(lora.forward([ids, mask]), reference.forward([ids, mask]), rtol=1e-5, atol=1e-5)
    assert np.abs(lora.forward([ids, mask]) - base.forward([ids, mask])).max() > 1e-2

    # the embedding table (read by Gather) follows Keras's Embedding LoRA: A (vocab, rank), B (rank, dim)
    emb = base.with_lora("embed.weight", rank=2, seed=0)
    assert emb.adapters["embed.weight"].layout == "kernel"
    assert emb.weight_variables["embed.weight/lora_a"].shape == (50, 2)


def test_a_starts_he_uniform_and_b_at_zero_seeded():
    net = TFNet.from_onnx(path_of("transformer")).cut("logits")
    one = net.with_lora("layer.linear", rank=8, seed=7)
    two = net.with_lora("layer.linear", rank=8, seed=7)
    a = one.get_weights()["layer.linear2.weight/lora_a"]  # (in 64, 8)
    limit = np.sqrt(6.0 / 64)
    assert a.shape == (64, 8) and np.abs(a).max() <= limit and np.abs(a).max() > 0.8 * limit
    assert np.std(a) == pytest.approx(limit / np.sqrt(3), rel=0.25)  # uniform's standard deviation
    assert not np.any(one.get_weights()["layer.linear2.weight/lora_b"])
    np.testing.assert_array_equal(a, two.get_weights()["layer.linear2.weight/lora_a"])
    assert one.adapters["layer.linear1.weight"].alpha == 8.0  # alpha defaults to rank


# ---------------------------------------------------------------- the adapters travel


@pytest.fixture
def adapted():
    keras.utils.set_random_seed(6)
    inp = keras.Input((5,), name="x")
    h = keras.layers.Dense(7, activation="relu", name="d1")(inp)
    model = keras.Model(inp, keras.layers.Dense(4, name="d2")(h))
    lora = TFNet.from_keras(model).with_lora("d1/", rank=2, alpha=4, seed=0)
    rng = np.random.default_rng(8)
    lora.set_weights({n: rng.normal(0, 0.5, lora.weight_variables[n].shape) for n in lora.adapter_names})
    return lora


X = np.random.default_rng(9).normal(size=(6, 5)).astype("float32")


def test_serialized_net_keeps_its_adapters(adapted):
    back = net_from_bytes(net_to_bytes(adapted))
    assert back.adapters == adapted.adapters and back.trainable == adapted.trainable
    assert back.weight_names == adapted.weight_names
    np.testing.assert_array_equal(back.forward(X), adapted.forward(X))


def test_cut_add_head_and_hooks_keep_the_adapters(adapted):
    features = adapted.cut("d1")
    assert list(features.adapters) == ["d1/kernel"] and features.trainable == adapted.adapter_names
    keras.utils.set_random_seed(1)
    headed = features.add_head(keras.layers.Dense(2, name="out"), name="head")
    assert list(headed.adapters) == ["d1/kernel"]
    assert set(headed.trainable) == set(adapted.adapter_names) | {"head/out/kernel", "head/out/bias"}
    np.testing.assert_allclose(headed.cut("d1").forward(X), adapted.cut("d1").forward(X), rtol=1e-6)

    seen = {}
    adapted.register_gradient_hook(lambda g: seen.update({k: v.shape for k, v in g.items()}))
    _, grads = adapted.backward(X)
    assert set(grads) == set(seen) == {"d1/kernel/lora_a", "d1/kernel/lora_b"}
    np.testing.assert_allclose(grads["d1/kernel/lora_a"], _tape_gradient(adapted), rtol=1e-5, atol=1e-6)


def _tape_gradient(lora):
    """d sum(f(x)) / d A by GradientTape on the formula written out with Keras's weights."""
    w = {k: tf.constant(v) for k, v in lora.get_weights().items()}
    a = tf.Variable(w["d1/kernel/lora_a"])
    with tf.GradientTape() as tape:
        k1 = w["d1/kernel"] + 2.0 * a @ w["d1/kernel/lora_b"]
        h = tf.nn.relu(X @ k1 + w["d1/bias"])
        out = tf.reduce_sum(h @ w["d2/kernel"] + w["d2/bias"])
    return tape.gradient(out, a).numpy()


def test_merged_net_is_plain_and_saves_in_every_format(adapted, tmp_path):
    merged = adapted.merged()
    assert merged.adapters == {} and merged.weight_names == ["d1/kernel", "d1/bias", "d2/kernel", "d2/bias"]
    assert merged.trainable == ["d1/kernel"]  # the weight whose adapters trained
    want = adapted.forward(X)
    np.testing.assert_allclose(merged.forward(X), want, rtol=1e-6, atol=1e-6)
    w = adapted.get_weights()
    np.testing.assert_allclose(merged.get_weights()["d1/kernel"],
                               w["d1/kernel"] + 2.0 * w["d1/kernel/lora_a"] @ w["d1/kernel/lora_b"], rtol=1e-6)

    adapted.save(tmp_path / "export")  # a net with adapters saves merged
    loaded = TFNet.load(tmp_path / "export")
    assert loaded.adapters == {} and loaded.trainable == ["d1/kernel"]
    np.testing.assert_allclose(loaded.forward(X), want, rtol=1e-6, atol=1e-6)
    adapted.save_saved_model(str(tmp_path / "sm"))
    served = tf.saved_model.load(str(tmp_path / "sm")).signatures["serving_default"]
    np.testing.assert_allclose(list(served(x=tf.constant(X)).values())[0].numpy(), want, rtol=1e-6, atol=1e-6)
    assert len(tf.saved_model.load(str(tmp_path / "sm")).weights) == 4
    graph = adapted.frozen_graph_def()
    assert not [n.name for n in graph.node if "lora" in n.name]
    assert graph.SerializeToString(deterministic=True) == merged.frozen_graph_def().SerializeToString(
        deterministic=True)


def test_merged_onnx_runs_under_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    lora = TFNet.from_onnx(path_of("transformer")).with_lora(re.compile(r"^layer\."), rank=4, seed=0)
    rng = np.random.default_rng(3)
    lora.set_weights({n: rng.normal(0, 0.2, lora.weight_variables[n].shape) for n in lora.adapter_names})
    path = str(tmp_path / "merged.onnx")
    lora.merged().save_onnx(path)
    ids = rng.integers(0, 50, (3, 8)).astype("int64")
    mask = np.ones((3, 8), "float32")
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    got = session.run(None, {"ids": ids, "mask": mask})
    for g, want in zip(got, lora.forward([ids, mask])):
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-5)
    assert os.path.getsize(path) < 1.2 * os.path.getsize(path_of("transformer"))


# ---------------------------------------------------------------- errors


def test_a_target_that_matches_nothing_lists_the_candidates(adapted):
    net = adapted.merged()
    with pytest.raises(WeightError, match=r"No LoRA target matches the prefix 'd3'\. Candidates \(2\): "
                                          r"'d1/kernel', 'd2/kernel'\."):
        net.with_lora("d3")
    with pytest.raises(WeightError, match=r"No LoRA target matches the pattern 'bias'\. Candidates \(2\)"):
        net.with_lora(re.compile("bias"))
    with pytest.raises(WeightError, match=r"Weight 'd1/bias' is not a kernel: LoRA applies to float kernels of "
                                          r"rank >= 2 .* Candidates \(2\): 'd1/kernel', 'd2/kernel'\."):
        net.with_lora(["d1/kernel", "d1/bias"])
    with pytest.raises(WeightError, match=r"Unknown weight 'd1/kernal'\. Candidates \(2\): 'd1/kernel'"):
        net.with_lora(["d1/kernal"])
    with pytest.raises(WeightError, match=r"\['d1/kernel'\] already have adapters; a weight takes one adapter"):
        adapted.with_lora(True)
    with pytest.raises(TypeError, match=r"`targets` takes a prefix string, .* Received: 3"):
        net.with_lora(3)


def test_rank_and_alpha_are_checked(adapted):
    net = adapted.merged()
    with pytest.raises(ValueError, match=r"`rank` must be a positive integer\. Received: rank=0"):
        net.with_lora(True, rank=0)
    with pytest.raises(ValueError, match=r"`alpha` must be a positive number or None \(then alpha = rank\)\. "
                                         r"Received: alpha=-1"):
        net.with_lora(True, alpha=-1)


def test_a_net_without_kernels_says_so():
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        tf.multiply(x, tf.constant([1.0, 2.0, 3.0], name="scale"), name="y")
    net = TFNet.from_frozen_graph(g.as_graph_def(), "x", "y")
    with pytest.raises(WeightError, match=r"No LoRA target matches True\. This net has no candidate: LoRA applies"):
        net.with_lora(True)


def test_adapters_extend_an_adapted_net():
    base = TFNet.from_onnx(path_of("transformer")).cut("logits")
    first = base.with_lora("layer.linear1", rank=2, seed=0)
    second = first.with_lora(["head.weight"], rank=4, seed=1)
    assert list(second.adapters) == ["layer.linear1.weight", "head.weight"]
    assert second.trainable == second.adapter_names
    np.testing.assert_array_equal(second.get_weights()["layer.linear1.weight/lora_a"],
                                  first.get_weights()["layer.linear1.weight/lora_a"])
