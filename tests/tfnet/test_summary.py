"""net.summary() and net.tensor_names(): what a new user reads to choose a cut point."""

import keras

from tfnet import TFNet


def small():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8, 8, 1), name="image"),
                              keras.layers.Conv2D(4, 3, activation="relu", name="conv"),
                              keras.layers.BatchNormalization(name="bn"), keras.layers.Flatten(name="flat"),
                              keras.layers.Dense(16, activation="relu", name="features"),
                              keras.layers.Dense(3, name="logits")])
    return TFNet.from_keras(model)


def line_of(text, fragment):
    return [line for line in text.splitlines() if fragment in line.split("  ")[0]][0]


def test_summary_lists_io_weights_and_totals():
    net = small()
    net.trainable = [n for n in net.weight_names if "/logits/" in n]
    lines = []
    text = net.summary(print_fn=lines.append)
    assert lines == [text]
    assert line_of(text, "input").split() == ["input", "image:0", "(None,", "8,", "8,", "1)", "float32"]
    assert line_of(text, "output").split()[2:] == ["(None,", "3)", "float32"]
    kernel = line_of(text, "/conv/kernel")
    assert "(3, 3, 1, 4)" in kernel and " 36 " in kernel and kernel.endswith("frozen")
    assert line_of(text, "/logits/kernel").endswith("trainable")
    assert line_of(text, "/bn/moving_mean").endswith("statistic")
    total = sum(int(v.shape.num_elements()) for v in net.weight_variables.values())
    assert f"Total values: {total:,}" in text and "trainable: 51 " in text  # 16 x 3 + 3
    assert "MatMul x2" in text and "Conv2D x1" in text


def test_tensor_names_are_the_cut_points():
    net = small()
    names = net.tensor_names()
    assert "features:0" in names and "conv:0" in names and "logits:0" in names
    assert not any(n.startswith("image") for n in names), "no placeholders"
    assert net.tensor_names(op_types=["MatMul"]) == [n for n in names if n.endswith("/MatMul:0")]
    assert net.tensor_names(contains="features") == [n for n in names if "features" in n]
    body = net.cut("features:0")
    assert body.output_specs[0].shape.as_list() == [None, 16]


def test_from_keras_names_inputs_by_their_input_layer():
    """Keras 3 names an unnamed input's tensor keras_tensor_N; tfnet uses the InputLayer's name,
    the one model.summary() shows (and keras.Input(name=...) sets)."""
    model = keras.applications.MobileNetV2(input_shape=(32, 32, 3), weights=None, alpha=0.35, classes=4)
    assert model.inputs[0].name.startswith("keras_tensor")
    net = TFNet.from_keras(model)
    layer = model.layers[0].name  # input_layer, or input_layer_N after other models in this process
    assert layer.startswith("input_layer") and net.input_names == [layer + ":0"]
    assert small().input_names == ["image:0"]
