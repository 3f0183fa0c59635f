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

A trainable ``BatchNormalization`` (:func:`batch_norms_to_train`, asked for by ``TFOptimizer.from_keras``) is
switched the same way: in training it normalizes by the batch's statistics and computes its moving ones' new values
as Keras's ``call`` does (``moving * momentum + batch * (1 - momentum)``), which the frozen graph returns beside the
outputs (``keras_update_<i>``, the net's :attr:`~tfnet.TFNet.updates`) for the training step to assign; in inference,
its moving statistics, unchanged.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf

PHASE = "keras_training"
SEED = "keras_seed_offset"

__all__ = ["PHASE", "SEED", "batch_norms_to_train", "has_switches", "inference_graph", "nested_layers",
           "random_training_layers", "renormalized_batch_norms", "switched", "training_graph", "unswitched_random_layers"]


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


def _trainable_batch_norms(model) -> list:
    """The trainable ``BatchNormalization`` layers of ``model`` (with their weights, in a trainable parent), which
    Keras's ``fit`` runs in training mode."""
    import keras

    return [layer for layer in nested_layers(model)
            if isinstance(layer, keras.layers.BatchNormalization) and layer.trainable and layer.trainable_weights]


def renormalized_batch_norms(model) -> list[str]:
    """The names of the trainable ``BatchNormalization`` layers of ``model`` with ``renorm``: Keras's ``fit``
    renormalizes them in training, which :func:`switched` does not do (they stay in inference mode)."""
    return [layer.name for layer in _trainable_batch_norms(model) if layer.renorm]


def batch_norms_to_train(model) -> list:
    """The ``BatchNormalization`` layers of ``model`` that Keras's ``fit`` runs in training mode and :func:`switched`
    can switch: the trainable ones without ``renorm``."""
    return [layer for layer in _trainable_batch_norms(model) if not layer.renorm]


@contextlib.contextmanager
def switched(layers: list, norms: list = (), updates: list | None = None):
    """Inside a function being traced: each layer of ``layers`` (and of ``norms``, batch normalization) called as
    ``tf.cond(phase, training, inference)``, a random layer's seed the generator's current state plus the seed
    offset, a batch norm's new moving statistics appended to ``updates`` as ``(variable, tensor)`` (see the module's
    text). Yields nothing; the layers' own ``call`` and generators are as before afterwards."""
    if not layers and not norms:
        yield
        return
    phase = tf.compat.v1.placeholder_with_default(False, (), name=PHASE)
    offset = tf.compat.v1.placeholder_with_default(tf.zeros((2,), tf.int64), (2,), name=SEED) if layers else None
    patched = []
    try:
        for layer in norms:
            layer.call = _switched_norm(layer, phase, updates if updates is not None else [])
            patched.append(layer)
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
            if getattr(layer, "seed_generator", None) is not None:
                del layer.seed_generator.next


def _switched_norm(layer, phase, updates: list):
    """``layer.call`` as ``tf.cond(phase, training mode, inference mode)``, returning the moving statistics' new
    values from the training branch (Keras's own ``call`` computes them: its ``assign`` is caught) and the moving
    statistics themselves from the inference branch, read outside it (the branch returns its inputs)."""
    own = layer.call
    moving = (layer.moving_mean, layer.moving_variance)

    def call(inputs, *args, training=None, **kwargs):
        inference = own(inputs, *args, training=False, **kwargs)
        current = [tf.convert_to_tensor(v.value) for v in moving]

        def train():
            if _fusable(layer, inputs, kwargs):
                return _fused_training(layer, inputs, current)
            caught = {}
            for v in moving:
                v.assign = lambda value, _v=v: caught.__setitem__(id(_v), value)
            try:
                out = own(inputs, *args, training=True, **kwargs)
            finally:
                for v in moving:
                    del v.assign
            return [out] + [tf.cast(caught[id(v)], c.dtype) for v, c in zip(moving, current)]

        out, *new = tf.cond(phase, train, lambda: [inference] + current)
        updates.extend(zip(moving, new))
        return out

    return call


def _fusable(layer, inputs, kwargs) -> bool:
    """Whether ``layer`` in training mode is TensorFlow's fused batch norm: float32 images in NHWC, normalized over
    the channels, no mask, no renorm."""
    axis = layer.axis if isinstance(layer.axis, int) else None
    rank = inputs.shape.rank
    return (rank == 4 and axis in (-1, 3) and inputs.dtype == tf.float32 and kwargs.get("mask") is None
            and not layer.renorm and layer.moving_mean.dtype == "float32")


def _fused_training(layer, inputs, current) -> list:
    """Keras's training-mode ``call`` on images as TensorFlow's fused kernel computes it (``FusedBatchNormV3``, its
    gradient fused too: a tenth less time a step than Keras's separate ops for EfficientNet-B0 on 2 cores, the same
    values to float32 rounding), and the moving statistics' new values as Keras computes them (the batch's variance without
    Bessel's correction, which the kernel's third output has)."""
    channels = inputs.shape[-1]
    gamma = tf.convert_to_tensor(layer.gamma.value) if layer.scale else tf.ones((channels,), tf.float32)
    beta = tf.convert_to_tensor(layer.beta.value) if layer.center else tf.zeros((channels,), tf.float32)
    out, mean, corrected = tf.compat.v1.nn.fused_batch_norm(inputs, gamma, beta, epsilon=layer.epsilon,
                                                            is_training=True)
    n = tf.cast(tf.size(inputs) // channels, tf.float32)
    variance = corrected * ((n - 1.0) / tf.maximum(n, 1.0))
    momentum = layer.momentum
    return [out, current[0] * momentum + mean * (1.0 - momentum), current[1] * momentum + variance * (1.0 - momentum)]


def inference_graph(graph_def, fed=()):
    """``graph_def`` with each switch of :func:`switched` (an ``If`` on a ``keras_training`` tensor) replaced by what
    its inference branch returns, some of its inputs (those layers are the identity in inference; a batch norm's
    inference output and moving statistics are computed outside the switch): a graph without the switches, for
    writers that take plain ops (ONNX) and for inference. A switch whose inference branch is not that is left, and
    one whose phase tensor's node is in ``fed``."""
    from tensorflow.core.framework import graph_pb2

    functions = {f.signature.name: f for f in graph_def.library.function}
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    taken: dict[str, str] = {}  # "if:k" -> the input it passes on
    for node in out.node:
        phase = _switch_phase(node)
        if phase is None or phase in fed:
            continue
        indices = _returned_arguments(functions.get(node.attr["else_branch"].func.name))
        if indices is None:
            continue
        for k, index in enumerate(indices):
            taken[f"{node.name}:{k}"] = node.input[1 + index]
        if len(indices) == 1:  # the If itself becomes the Identity of what it passes on
            data, dtype = node.input[1 + indices[0]], node.attr["Tin"].list.type[indices[0]]
            node.op = "Identity"
            del node.input[:]
            node.input.append(data)
            node.ClearField("attr")
            node.attr["T"].type = dtype
            del taken[f"{node.name}:0"]
    if taken:
        switches = {t.split(":")[0] for t in taken}
        for node in out.node:
            inputs = []
            for name in node.input:
                key = name if ":" in name else name + ":0"
                while key in taken:  # a switch's input may be another's output
                    name = taken[key]
                    key = name if ":" in name else name + ":0"
                if name[1:] not in switches:  # a wait on a switch goes with it
                    inputs.append(name)
            del node.input[:]
            node.input.extend(inputs)
        kept = [n for n in out.node if n.name not in switches]
        del out.node[:]
        out.node.extend(kept)
    return out


def training_graph(graph_def, phases):
    """``graph_def`` as the training step runs it, each switch of :func:`switched` whose phase tensor's node is in
    ``phases`` (fed True) given a zero of unknown static shape in place of each input only its inference branch
    reads (a batch norm's inference output, computed outside the switch): that computation, and its gradient, are
    left unread, so the step does not run them. None where no switch has such an input."""
    from tensorflow.core.framework import graph_pb2

    functions = {f.signature.name: f for f in graph_def.library.function}
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    zeros = []
    for node in out.node:
        if _switch_phase(node) not in phases:
            continue
        read = _read_arguments(functions.get(node.attr["then_branch"].func.name))
        for k, dtype in enumerate(node.attr["Tin"].list.type if read is not None else ()):
            if k not in read and (tf.as_dtype(dtype).is_floating or tf.as_dtype(dtype).is_integer):
                name = f"{node.name}/tfnet_unread_{k}"
                zeros.append((name, dtype))
                node.input[1 + k] = name
    if not zeros:
        return None
    for name, dtype in zeros:  # of unknown shape, which the inference branch's gradient (never run) matches
        const, zero = out.node.add(), out.node.add()
        const.name, const.op = name + "/value", "Const"
        const.attr["dtype"].type = dtype
        const.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(0, dtype=tf.as_dtype(dtype)))
        zero.name, zero.op = name, "PlaceholderWithDefault"
        zero.input.append(const.name)
        zero.attr["dtype"].type = dtype
        zero.attr["shape"].shape.unknown_rank = True
    return out


def _read_arguments(function) -> set[int] | None:
    """The indices of the input arguments of ``function`` that its nodes or its outputs read; None without it."""
    if function is None:
        return None
    args = [a.name for a in function.signature.input_arg]
    names = {i.lstrip("^").split(":")[0] for n in function.node_def for i in n.input}
    names |= {v.split(":")[0] for v in function.ret.values()}
    return {k for k, a in enumerate(args) if a in names}


def has_switches(graph_def, fed=()) -> bool:
    """Whether ``graph_def`` has a switch of :func:`switched` (an ``If`` on a ``keras_training`` tensor) whose phase
    tensor's node is not in ``fed``."""
    return any((phase := _switch_phase(n)) is not None and phase not in fed for n in graph_def.node)


def _switch_phase(node) -> str | None:
    """The phase tensor's node that ``node`` switches on, where it is a switch of :func:`switched` (an ``If`` on a
    ``keras_training`` tensor); None for any other node."""
    if node.op in ("If", "StatelessIf") and _is_phase(phase := node.input[0].split(":")[0]):
        return phase
    return None


def _is_phase(node: str) -> bool:
    """Whether ``node`` is a phase tensor's (a head's, under its prefix), or the constant baked in its place
    (``frozen_graph_def(phase=...)``, :func:`tfnet.graph_utils.bake_tensors`)."""
    parts = node.split("/")
    return parts[-1] == PHASE or parts[-2:] == [PHASE, "tfnet_baked"]


def _returned_arguments(function) -> list[int] | None:
    """For each output of ``function``, the index of the input argument it returns unchanged (through ``Identity``
    nodes); None where an output is computed."""
    if function is None or not function.signature.output_arg:
        return None
    args = [a.name for a in function.signature.input_arg]
    nodes = {n.name: n for n in function.node_def}
    found = []
    for arg in function.signature.output_arg:
        index = _traced_back(function.ret[arg.name], args, nodes)
        if index is None:
            return None
        found.append(index)
    return found


def _traced_back(value: str, args: list[str], nodes: dict) -> int | None:
    for _ in range(len(nodes) + 1):
        name = value.split(":")[0]
        if name in args:
            return args.index(name)
        node = nodes.get(name)
        if node is None or node.op != "Identity":
            return None
        value = node.input[0]
    return None
