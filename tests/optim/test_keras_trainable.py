"""``from_keras`` keeps Keras's trainable flags (issue 51): the set tfnet trains starts as exactly Keras's
``trainable_variables`` for a model object, a ``.keras`` file and a Keras SavedModel export; Keras's transfer-learning
flow (frozen base, new head, then the base unfrozen at a low rate) trains to Keras's own ``fit`` weights; a LoRA
layer's base kernel stays frozen as in Keras."""


import keras
import numpy as np

import optim
from optim import TFOptimizer
from tests.optim.keras_transfer import LR_FINE, LR_HEAD, data, keras_fit, max_diff, transfer_model, unfreeze_all_but_batch_norm
from tfnet import TFNet

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


def test_every_road_from_keras_keeps_the_trainable_flags(tmp_path):
    model, base = transfer_model()
    want = [v.path for v in model.trainable_variables]
    assert want == ["head/kernel", "head/bias"]
    model.save(str(tmp_path / "m.keras"))
    model.export(str(tmp_path / "export"), verbose=False)
    for net in (TFNet.from_keras(model), TFNet.from_keras(str(tmp_path / "m.keras")),
                TFNet.from_saved_model(str(tmp_path / "export"))):
        assert net.trainable == want
        assert set(net.backward(np.zeros((2, 8, 8, 3), np.float32), np.ones((2, 3), np.float32))[1]) == set(want)
    net = TFNet.from_keras(model)
    net.trainable = True  # setting it afterwards works as documented: everything but the batch-norm statistics
    assert net.trainable == ["base/conv/kernel", "base/conv/bias", "base/bn/gamma", "base/bn/beta", *want]
    # a model that records no flags (a frozen graph) still gets TFNet's default
    plain = TFNet.from_frozen_graph(net.frozen_graph_def(), net.input_names, net.output_names)
    assert len(plain.trainable) == 6


def test_the_transfer_learning_flow_trains_as_keras_fit():
    x, y = data()
    reference, _ = transfer_model()
    model, _ = transfer_model()
    net = TFNet.from_keras(model)
    # phase one: the head alone, as Keras fits it
    want = keras_fit(reference, x, y, LR_HEAD, 8)
    TFOptimizer(net, SCE, optim.SGD(LR_HEAD)).optimize((x, y), batch_size=8, shuffle=False, verbose=0)
    assert max_diff(net, want) < 1e-6
    initial = TFNet.from_keras(transfer_model()[0]).get_weights()
    for k in initial:  # the base did not move, and the head did
        assert np.array_equal(net.get_weights([k])[k], initial[k]) == k.startswith("base/"), k
    # phase two: the base unfrozen, a low rate; its batch norm kept frozen, so that it runs in inference mode (Keras 3's
    # fit calls a nested model with training=True whatever the call said: only a frozen BatchNormalization stays in
    # inference mode), and tfnet's net takes the new flags by Keras's names
    for keras_model in (reference, model):
        unfreeze_all_but_batch_norm(keras_model.get_layer("base"))
    want = keras_fit(reference, x, y, LR_FINE, 8)
    net.trainable = [v.path for v in model.trainable_variables]
    assert net.trainable == ["base/conv/kernel", "base/conv/bias", "head/kernel", "head/bias"]
    TFOptimizer(net, SCE, optim.SGD(LR_FINE)).optimize((x, y), batch_size=8, shuffle=False, verbose=0)
    assert max_diff(net, want) < 1e-6
    assert float(np.abs(want["base/conv/kernel"] - initial["base/conv/kernel"]).max()) > 1e-4, "phase two moved the base"
    np.testing.assert_array_equal(want["base/bn/moving_mean"], initial["base/bn/moving_mean"])  # inference mode


def test_a_lora_layer_trains_its_adapters_and_bias_as_keras_does():
    keras.utils.set_random_seed(0)
    x, y = data()
    x = x.reshape(len(x), -1)[:, :6]

    def lora_model():
        keras.utils.set_random_seed(1)
        m = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, name="d")], name="lora")
        m.layers[0].enable_lora(2)
        m.layers[0].lora_kernel_b.assign(np.full((2, 3), 0.1, np.float32))  # B starts at zero: give it a value
        return m

    reference = lora_model()
    net = TFNet.from_keras(lora_model())
    assert sorted(net.trainable) == sorted(v.path for v in reference.trainable_variables)
    assert not any(n.endswith("/kernel") for n in net.trainable)
    initial = net.get_weights()
    want = keras_fit(reference, x, y, LR_HEAD, 8)
    TFOptimizer(net, SCE, optim.SGD(LR_HEAD)).optimize((x, y), batch_size=8, shuffle=False, verbose=0)
    assert max_diff(net, want) < 1e-6
    np.testing.assert_array_equal(net.get_weights(["lora/d/kernel"])["lora/d/kernel"], initial["lora/d/kernel"])
    assert float(np.abs(want["lora/d/lora_kernel_a"] - initial["lora/d/lora_kernel_a"]).max()) > 1e-4
