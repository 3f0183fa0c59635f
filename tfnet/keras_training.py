"""Keras's random training-time layers in a frozen graph: ``Dropout`` (and ``SpatialDropout1D/2D/3D``, an attention
layer's dropout), ``GaussianNoise``, ``GaussianDropout`` and ``AlphaDropout`` act only when called with
``training=True``, as Keras's ``fit`` calls them, and draw their noise from a ``SeedGenerator`` whose state goes up by
``[0, 1]`` at each call.

A net is frozen with ``training=False`` (batch norm on its moving statistics, :mod:`tfnet.freeze`), so these layers
would do nothing while tfnet trains. :func:`switched` traces each of them as ``tf.cond(keras_training, layer in
training mode, layer in inference mode)``, ``keras_training`` a ``PlaceholderWithDefault`` of False (the net's phase
tensor: :attr:`tfnet.TFNet.phase_values` feeds it True in the training step), and its seed as the generator's state
when frozen plus ``keras_seed_offset`` (int64 ``(2,)``, default zeros), which the training step feeds ``[stream, step]``
(:class:`tfnet.net_state.NetState`: ``seed_step`` counts the steps, ``seed_stream`` is the rank). So the ``k``-th step
of a net frozen from a fresh model draws the very noise Keras's ``fit`` draws at its ``k``-th step, and the graph
served (no feed) is the inference graph.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf

PHASE = "keras_training"
SEED = "keras_seed_offset"

__all__ = ["PHASE", "SEED", "inference_graph", "nested_layers", "random_training_layers", "switched",
           "trainable_batch_norms", "unswitched_random_layers"]


def nested_layers(model, include_self: bool = False) -> list:
    """``model``'s layers, nested ones included, by Keras's own walk over them (``_flatten_layers``, what
    ``model.losses`` reads); ``include_self``: ``model`` first."""
    flatten = getattr(model, "_flatten_layers", None)
    if callable(flatten):
        return list(flatten(include_self=include_self))
    return [model] if include_self else []


def random_training_layers(model) -> list:
    """The layers of ``model`` (nested ones included) that draw noise in training: Keras's dropout and noise layers
    with a rate (or deviation) above 0 and a seed generator."""
    import keras

    kinds = (keras.layers.Dropout, keras.layers.GaussianNoise, keras.layers.GaussianDropout, keras.layers.AlphaDropout)
    found = []
    for layer in nested_layers(model, include_self=True):
        amount = getattr(layer, "rate", getattr(layer, "stddev", 0.0))
        if isinstance(layer, kinds) and amount and getattr(layer, "seed_generator", None) is not None:
            found.append(layer)
    return found


def unswitched_random_layers(model) -> list[str]:
    """The names of the layers of ``model`` that draw noise in training which :func:`switched` does not switch on:
    a recurrent layer's (or cell's) ``dropout`` or ``recurrent_dropout``, Keras's random augmentation layers
    (``RandomFlip``, ``RandomRotation``, ...). tfnet trains them in inference mode, where Keras's ``fit`` draws."""
    import keras

    switched_ones = {id(layer) for layer in random_training_layers(model)}
    layers = nested_layers(model)
    rnn_of = {id(layer.cell): layer for layer in layers if isinstance(layer, keras.layers.RNN)}  # named by its layer
    names = []
    for layer in layers:
        if id(layer) in switched_ones or isinstance(layer, keras.layers.RNN):
            continue
        rnn = getattr(layer, "dropout", 0) or getattr(layer, "recurrent_dropout", 0)
        seeded = any(isinstance(getattr(layer, a, None), keras.random.SeedGenerator)
                     for a in ("seed_generator", "generator"))
        if (isinstance(rnn, (int, float)) and rnn > 0 and seeded) or (
                seeded and not isinstance(layer, keras.layers.Dropout) and "Random" in type(layer).__name__):
            names.append(rnn_of[id(layer)].name if id(layer) in rnn_of else layer.name)
    return names


def trainable_batch_norms(model) -> list[str]:
    """The names of the trainable ``BatchNormalization`` layers of ``model`` (in a trainable parent): Keras's ``fit``
    normalizes by each batch's statistics there and updates the moving ones; a frozen graph, by the moving ones."""
    import keras

    return [layer.name for layer in nested_layers(model)
            if isinstance(layer, keras.layers.BatchNormalization) and layer.trainable and layer.trainable_weights]


@contextlib.contextmanager
def switched(layers: list):
    """Inside a function being traced: each layer of ``layers`` called as ``tf.cond(phase, training, inference)``,
    its seed the generator's current state plus the seed offset (see the module's text). Yields nothing; the layers'
    own ``call`` and generators are as before afterwards."""
    if not layers:
        yield
        return
    phase = tf.compat.v1.placeholder_with_default(False, (), name=PHASE)
    offset = tf.compat.v1.placeholder_with_default(tf.zeros((2,), tf.int64), (2,), name=SEED)
    patched = []
    try:
        for layer in layers:
            generator = layer.seed_generator
            with tf.init_scope():  # the state as it is now, not a read of the variable in the graph
                base = tf.constant(generator.state.numpy(), tf.int64)
            dtype = generator.state.dtype

            def next_seed(ordered=True, _base=base, _dtype=dtype):
                return tf.cast(_base + offset, _dtype)

            def call(*args, _own=layer.call, training=None, **kwargs):
                return tf.cond(phase, lambda: _own(*args, training=True, **kwargs),
                               lambda: _own(*args, training=False, **kwargs))

            generator.next = next_seed
            layer.call = call
            patched.append(layer)
        yield
    finally:
        for layer in patched:
            del layer.call
            del layer.seed_generator.next


def inference_graph(graph_def):
    """``graph_def`` with each switch of :func:`switched` (an ``If`` on a ``keras_training`` tensor) replaced by what
    its inference branch returns, one of its inputs (those layers are the identity in inference): a graph without the
    switches, for writers that take plain ops (ONNX). A switch whose inference branch is not that is left."""
    from tensorflow.core.framework import graph_pb2

    functions = {f.signature.name: f for f in graph_def.library.function}
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    for node in out.node:
        if node.op not in ("If", "StatelessIf") or node.input[0].split(":")[0].split("/")[-1] != PHASE:
            continue
        index = _returned_argument(functions.get(node.attr["else_branch"].func.name))
        if index is None:
            continue
        data = node.input[1 + index]
        node.op = "Identity"
        del node.input[:]
        node.input.append(data)
        dtype = node.attr["Tin"].list.type[index]
        node.ClearField("attr")
        node.attr["T"].type = dtype
    return out


def _returned_argument(function) -> int | None:
    """The index of the input argument a one-output function returns unchanged (through ``Identity`` nodes), or
    None."""
    if function is None or len(function.signature.output_arg) != 1:
        return None
    args = [a.name for a in function.signature.input_arg]
    nodes = {n.name: n for n in function.node_def}
    value = function.ret[function.signature.output_arg[0].name]
    for _ in range(len(nodes) + 1):
        name = value.split(":")[0]
        if name in args:
            return args.index(name)
        node = nodes.get(name)
        if node is None or node.op != "Identity":
            return None
        value = node.input[0]
    return None
