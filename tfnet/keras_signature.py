"""How :func:`tfnet.freeze.freeze_keras` calls a Keras model: its inputs' specs and names, and how the frozen graph's
flat inputs are arranged into the model's call.

A Functional or Sequential model has symbolic inputs (``model.inputs``): they give the specs, named after their
``keras.Input`` layers, and the model is called with them in its input structure. A subclassed model (``call``
written by hand, as Keras's guide "Making new layers and models via subclassing" writes it) has none. Its inputs
come, as ``model.export`` takes them, from ``input_signature`` (one entry per positional argument of ``call``: a
``tf.TensorSpec`` or ``keras.InputSpec``, or a dict, list or tuple of them) or else from the shapes Keras recorded
at the model's first call (the first argument only, in ``model.input_dtype``: Keras records no more), each with the
batch dimension left free. Such an input is named after the spec's own name, else the dict key or the ``call``
argument it fills (``x``, ``tokens``; ``x_0``, ``x_1`` for a list).
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import tensorflow as tf

from tfnet.errors import InputSpecError
from tfnet.graph_utils import clean_node_name, unique_name

__all__ = ["KerasCall", "keras_call", "leaf_paths"]

# call() arguments that are not inputs: Keras passes them itself
_NOT_INPUTS = {"training", "mask"}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Keras's bold in its error texts


class KerasCall:
    """The model's input specs, flat and named (the frozen graph's placeholders), and :meth:`arguments`, which arranges
    the flat tensors into the positional arguments of the model's call."""

    def __init__(self, specs: list[tf.TensorSpec], structures: list[Any] | None, functional_struct: Any = None):
        self.specs = specs
        self._structures = structures
        self._functional_struct = functional_struct

    @property
    def from_signature(self) -> bool:
        """Whether the specs are a signature's (given or recorded), not the model's own symbolic inputs."""
        return self._structures is not None

    def call_failure(self, model, exc: BaseException) -> InputSpecError:
        """The error for a model that fails when called on these specs (a signature that does not fit it), with the
        line of Keras's or TensorFlow's message that says why."""
        text = _ANSI.sub("", str(exc))
        lines = [line.strip() for line in text.splitlines() if line.strip()
                 and not line.startswith(("Exception encountered when calling", "Arguments received by"))
                 and not line.strip().startswith("\u2022")]
        reason = lines[0] if lines else type(exc).__name__
        inputs = ", ".join(f"{s.name} {tuple(s.shape.as_list())} {s.dtype.name}" for s in self.specs)
        return InputSpecError(
            f"{_which(model)} fails when called on its input signature ({inputs}): {reason[:500].rstrip('.')}. Check "
            "input_signature (one tf.TensorSpec per argument of the model's call) against the shapes and dtypes the "
            "model takes.")

    def arguments(self, xs) -> list:
        xs = list(xs)
        if self._structures is not None:
            return tf.nest.pack_sequence_as(self._structures, xs)
        struct = self._functional_struct
        if struct is not None and len(tf.nest.flatten(struct)) == len(xs):
            return [tf.nest.pack_sequence_as(struct, xs)]
        return [xs[0] if len(xs) == 1 else xs]


def keras_call(model, input_signature=None) -> KerasCall:
    """How to call ``model`` to freeze it (see the module's text).

    Raises:
        InputSpecError: a subclassed model that was never called or built and has no ``input_signature``; a
            signature with fewer entries than ``call`` has required arguments, or more than it has input arguments;
            a shape without a rank. (A signature the model fails on: :meth:`KerasCall.call_failure`.)
        TypeError: an ``input_signature`` entry that is not a ``tf.TensorSpec`` or ``keras.InputSpec`` (or a dict,
            list or tuple of them).
    """
    if input_signature is None and getattr(model, "inputs", None):
        return KerasCall(_functional_specs(model), None, getattr(model, "_inputs_struct", None))
    params, required, varargs = _call_arguments(model)
    if input_signature is None:
        structures = _recorded(model)
        if structures is None:
            raise InputSpecError(
                f"{_which(model)} has no inputs to freeze it on: it is not built on keras.Input and was never "
                "called. Call it once on data, or pass input_signature=[tf.TensorSpec(shape, dtype), ...] (one entry "
                "per argument of its call, as model.export takes it) to TFNet.from_keras.")
    else:
        if isinstance(input_signature, (tf.TensorSpec, _input_spec_type(), dict)):
            input_signature = [input_signature]
        if not isinstance(input_signature, (list, tuple)):
            raise TypeError("input_signature is a list with one entry per positional argument of the model's call: "
                            f"a tf.TensorSpec or keras.InputSpec (or a dict, list or tuple of them). Received: "
                            f"{input_signature!r}")
        structures = [tf.nest.map_structure(_tensor_spec, s) for s in input_signature]
    if len(structures) < len(required):
        what = "input_signature has" if input_signature is not None else "Keras recorded the shape of"
        raise InputSpecError(
            f"{_which(model)} takes {len(required)} inputs ({', '.join(required)}); {what} {len(structures)}. Pass "
            "input_signature=[...] with one tf.TensorSpec (or keras.InputSpec) for each argument of its call to "
            "TFNet.from_keras.")
    if len(structures) > len(params) and not varargs and params:
        raise InputSpecError(
            f"{_which(model)} takes {len(params)} input argument(s) ({', '.join(params)}); input_signature has "
            f"{len(structures)} entries. Give one entry per argument of its call: several inputs of one argument as a "
            "list or dict in that entry, as model.export takes them ([[spec_a, spec_b]] for a Functional model with "
            "two inputs).")
    specs, taken = [], set()
    for i, structure in enumerate(structures):
        argument = params[i] if i < len(params) else f"input_{i}"
        for path, spec in leaf_paths(structure):
            base = spec.name or (path if isinstance(structure, dict) else f"{argument}_{path}" if path else argument)
            name = unique_name(clean_node_name(base), taken)
            taken.add(name)
            specs.append(tf.TensorSpec(spec.shape, spec.dtype, name=name))
    named = tf.nest.pack_sequence_as(structures, specs)
    return KerasCall(specs, list(named))


def _which(model) -> str:
    """How the error texts name the model: "The Keras model 'name' (Class)"."""
    return f"The Keras model {getattr(model, 'name', '?')!r} ({type(model).__name__})"


def leaf_paths(structure) -> list[tuple[str, Any]]:
    """``(path, leaf)`` for each leaf of a nest of dicts, lists and tuples, in ``tf.nest.flatten``'s order (a dict's
    keys sorted); a path joins the keys and positions with "/", "" for a bare leaf."""
    if isinstance(structure, dict):
        items = [(str(k), structure[k]) for k in sorted(structure)]
    elif isinstance(structure, (list, tuple)):
        items = [(str(i), v) for i, v in enumerate(structure)]
    else:
        return [("", structure)]
    return [(f"{key}/{path}" if path else key, leaf) for key, value in items for path, leaf in leaf_paths(value)]


def _functional_specs(model) -> list[tf.TensorSpec]:
    specs = []
    taken: set[str] = set()
    for i, t in enumerate(model.inputs):
        name = unique_name(clean_node_name(_input_name(t) or f"input_{i}"), taken)
        taken.add(name)
        specs.append(tf.TensorSpec(tuple(t.shape), tf.as_dtype(t.dtype), name=name))
    return specs


def _input_name(tensor) -> str | None:
    """The name of the InputLayer that makes ``tensor`` (what ``model.summary()`` shows and what
    ``keras.Input(name=...)`` sets; Keras 3 names an unnamed input's tensor ``keras_tensor_N``), else
    the tensor's own name."""
    history = getattr(tensor, "_keras_history", None)
    layer = getattr(history, "operation", None) if history is not None else None
    return getattr(layer, "name", None) or getattr(tensor, "name", None)


def _call_arguments(model) -> tuple[list[str], list[str], bool]:
    """The names of the positional arguments of ``model.call`` that take inputs, those without a default, and whether
    it takes ``*args``."""
    try:
        signature = inspect.signature(model.call)
    except (TypeError, ValueError):
        return [], [], True
    params = [p for p in signature.parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in _NOT_INPUTS]
    varargs = any(p.kind == p.VAR_POSITIONAL for p in signature.parameters.values())
    return [p.name for p in params], [p.name for p in params if p.default is p.empty], varargs


def _recorded(model) -> list[Any] | None:
    """The specs Keras recorded at the model's first call or ``build`` (as ``model.export`` infers them): the batch
    dimension free, the dtype ``model.input_dtype``; None where Keras recorded nothing."""
    shapes = getattr(model, "_build_shapes_dict", None)
    if not shapes:
        return None
    dtype = tf.as_dtype(getattr(model, "input_dtype", None) or "float32")

    def specs(structure):
        if isinstance(structure, dict):
            return {k: specs(v) for k, v in structure.items()}
        if isinstance(structure, (list, tuple)) and all(isinstance(d, int) or d is None for d in structure):
            return tf.TensorSpec((None, *structure[1:]), dtype)
        if isinstance(structure, (list, tuple)):
            return type(structure)(specs(v) for v in structure)
        raise InputSpecError(f"Keras recorded an input shape tfnet cannot read: {structure!r}; pass input_signature.")

    return [specs(v) for v in shapes.values()]


def _input_spec_type():
    import keras

    return keras.InputSpec


def _tensor_spec(spec) -> tf.TensorSpec:
    if isinstance(spec, tf.TensorSpec):
        if spec.shape.rank is None:
            raise InputSpecError(f"input_signature needs each input's rank; {spec!r} has none.")
        return spec
    if isinstance(spec, _input_spec_type()):
        if spec.shape is None or spec.dtype is None:
            raise InputSpecError(f"input_signature's keras.InputSpec needs a shape and a dtype. Received: {spec!r}")
        return tf.TensorSpec(spec.shape, tf.as_dtype(spec.dtype), name=spec.name)
    raise TypeError("input_signature's entries are tf.TensorSpec or keras.InputSpec (or a dict, list or tuple of "
                    f"them). Received: {spec!r}")
