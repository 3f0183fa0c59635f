"""A net with low-rank adapters under TFOptimizer on one worker: checkpoints hold the adapters and the
fingerprint of the frozen base, a resumed run continues bit for bit, resuming onto another base is a
CheckpointError naming both fingerprints, and TFPredictor serves the adapted and the merged net alike."""

import keras
import numpy as np
import pytest

import optim
from optim import TFOptimizer, TFPredictor
from optim.training.checkpoint import CheckpointManager
from tests import digits
from tfnet import TFNet
from tfnet.lora import fingerprint

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


def base_net(seed=0):
    keras.utils.set_random_seed(seed)
    inp = keras.Input((8, 8, 1), name="image")
    h = keras.layers.Dense(32, activation="relu", name="d1")(keras.layers.Flatten(name="flat")(inp))
    return TFNet.from_keras(keras.Model(inp, keras.layers.Dense(10, name="d2")(h)))


def adapted(seed=0, lora_seed=0):
    return base_net(seed).with_lora(True, rank=4, alpha=8, seed=lora_seed)


def data(n=256):
    x, y = digits.load()
    return x[:n], y[:n]


def test_checkpoints_hold_the_adapters_and_the_base_fingerprint(tmp_path):
    x, y = data()
    net = adapted()
    base = {n: v for n, v in net.get_weights().items() if n not in net.adapter_names}
    opt = TFOptimizer(net, SCE, optim.Adam(0.01), model_dir=str(tmp_path))
    history = opt.optimize((x, y), epochs=3, batch_size=32, verbose=0)
    assert history["loss"][-1] < 0.7 * history["loss"][0], history
    for name, value in base.items():  # the base is frozen, bit for bit
        assert np.array_equal(net.get_weights()[name], value), name

    ckpt = CheckpointManager(str(tmp_path / "checkpoints"), run_id=opt.last_run["run_id"]).latest_valid()
    assert list(ckpt.weights) == net.adapter_names == ["d1/kernel/lora_a", "d1/kernel/lora_b",
                                                        "d2/kernel/lora_a", "d2/kernel/lora_b"]
    assert ckpt.extra["base_weights"] == {"sha256": fingerprint(base), "count": 4}
    for name in net.adapter_names:
        assert np.array_equal(ckpt.weights[name], net.get_weights()[name]), name


def test_a_resumed_run_continues_bit_for_bit(tmp_path):
    x, y = data()
    straight = adapted()
    TFOptimizer(straight, SCE, optim.Adam(0.01)).optimize((x, y), epochs=2, batch_size=32, verbose=0)
    TFOptimizer(adapted(), SCE, optim.Adam(0.01), model_dir=str(tmp_path)).optimize(
        (x, y), epochs=1, batch_size=32, verbose=0)
    again = adapted(lora_seed=5)  # another draw of A: the checkpoint's adapters replace it
    opt = TFOptimizer(again, SCE, optim.Adam(0.01), model_dir=str(tmp_path))
    opt.optimize((x, y), epochs=2, batch_size=32, resume=True, verbose=0)
    assert opt.last_run["resumed_from"]
    for name, value in straight.get_weights().items():
        assert np.array_equal(again.get_weights()[name], value), name


def test_resuming_onto_another_base_is_refused(tmp_path):
    x, y = data(64)
    first = adapted()
    TFOptimizer(first, SCE, optim.Adam(0.01), model_dir=str(tmp_path)).optimize(
        (x, y), epochs=1, batch_size=32, verbose=0)
    theirs = fingerprint({n: v for n, v in first.get_weights().items() if n not in first.adapter_names})
    other = adapted(seed=1)  # the same architecture and adapters, other base weights
    mine = fingerprint({n: v for n, v in other.get_weights().items() if n not in other.adapter_names})
    assert mine != theirs
    with pytest.raises(optim.CheckpointError,
                       match=rf"holds adapters trained on base weights of fingerprint {theirs} \(4 weights\), but this "
                             rf"net's base weights have fingerprint {mine} \(4 weights\): they belong to another base"):
        TFOptimizer(other, SCE, optim.Adam(0.01), model_dir=str(tmp_path)).optimize(
            (x, y), epochs=2, batch_size=32, resume=True, verbose=0)
    fewer = base_net().with_lora("d2/", rank=4, alpha=8, seed=0)
    with pytest.raises(optim.CheckpointError, match=r"holds weights \['d1/kernel/lora_a', 'd1/kernel/lora_b'\] that "
                                                    r"this net does not have; it was written for a net with other"):
        TFOptimizer(fewer, SCE, optim.Adam(0.01), model_dir=str(tmp_path)).optimize(
            (x, y), epochs=2, batch_size=32, resume=True, verbose=0)


def test_predictor_serves_the_adapted_and_the_merged_net_alike():
    x, _ = data(40)
    net = adapted()
    rng = np.random.default_rng(0)
    net.set_weights({n: rng.normal(0, 0.3, net.weight_variables[n].shape) for n in net.adapter_names})
    with TFPredictor(net, batch_per_thread=16) as p, TFPredictor(net.merged(), batch_per_thread=16) as q:
        assert p.snapshot.model_id == q.snapshot.model_id  # the same frozen graph: adapters folded in
        np.testing.assert_allclose(p.predict(x), net.forward(x), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(p.predict(x), q.predict(x))
    assert np.abs(net.forward(x) - base_net().forward(x)).max() > 0.1


def test_rank_zeros_result_carries_the_adapters_not_the_base():
    """Rank 0's result (packed by the rank, read by the driver) holds what training can change: the
    adapters of an adapted net, every weight of a plain one."""
    from optim.protocol import RunResult, pack_result, unpack_result
    from tfnet.lora import carried_weight_names  # what rank 0 packs (optim.rank.rank)

    net, plain = adapted(), base_net()

    def packed(n):
        return unpack_result(pack_result(n.get_weights(carried_weight_names(n)), RunResult({}, 3, []), {})).weights

    weights = packed(net)
    assert list(weights) == net.adapter_names
    for name, value in weights.items():
        assert np.array_equal(value, net.get_weights()[name]), name
    assert list(packed(plain)) == plain.weight_names
