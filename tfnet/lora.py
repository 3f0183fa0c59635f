"""Low-rank adapters (LoRA) on the weights of any frozen graph, with Keras 3's conventions.

A target weight ``W`` is used as ``W + (alpha / rank) * A @ B``: the graph still reads ``W``'s
placeholder, and what is fed there is computed from ``W`` (frozen) and the adapters ``A`` and ``B``
(trainable) inside the same function that runs the graph, so forward, backward and the fused step
differentiate to ``A`` and ``B`` with no graph surgery. ``A`` starts He-uniform and ``B`` at zero,
so a new adapted net computes exactly what its base did.

Which weights can be targets (:func:`candidates`), and the shapes of their adapters:

* ``"kernel"``: a float weight of rank >= 2 that a ``MatMul``, ``BatchMatMul`` or ``Einsum`` reads
  (through identities, casts, reshapes and transposes), or a 2-D table that a ``Gather`` reads (an
  embedding). ``A`` has ``W.shape[:-1] + (rank,)`` and ``B`` ``(rank, W.shape[-1])``, and ``A @ B``
  contracts ``A``'s last axis: Keras's ``Dense``, ``EinsumDense`` (so ``MultiHeadAttention``'s
  projections) and ``Embedding`` LoRA exactly.
* ``"transposed"``: a 2-D kernel stored ``(out, in)`` (PyTorch's ``Linear`` as ONNX exports it, read
  by ``MatMul(transpose_b=True)`` or through a ``Transpose``). ``A`` has ``(in, rank)``, ``B``
  ``(rank, out)``, and ``W + s * (A @ B)^T`` is used: the same function of the input as Keras's.

Convolution kernels, biases and normalisation scales are not targets.

Pure helpers over GraphDefs and arrays; :class:`tfnet.TFNet` holds the adapters
(:meth:`~tfnet.TFNet.with_lora`, :meth:`~tfnet.TFNet.merged`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tfnet import graph_utils as gu
from tfnet.errors import WeightError, closest_names

__all__ = ["Adapter", "LAYOUTS", "candidates", "select_targets", "new_adapters", "adapted_weights",
           "fingerprint", "carried_weight_names"]

#: How an adapter's product meets its weight: see the module's docstring.
LAYOUTS = ("kernel", "transposed")

_PASS_THROUGH = {"Identity", "Snapshot", "Cast", "Reshape", "Transpose", "EnsureShape", "CheckNumerics"}
_MATMULS = {"MatMul": ("transpose_a", "transpose_b"), "_FusedMatMul": ("transpose_a", "transpose_b"),
            "BatchMatMul": ("adj_x", "adj_y"), "BatchMatMulV2": ("adj_x", "adj_y"),
            "BatchMatMulV3": ("adj_x", "adj_y"), "Einsum": None}
_GATHERS = {"Gather", "GatherV2", "ResourceGather"}
_MAX_HOPS = 6
_KINDS = ("float kernels of rank >= 2 read by MatMul, BatchMatMul or Einsum (dense layers, attention "
          "projections) and 2-D embedding tables read by Gather")


class Adapter(NamedTuple):
    """One target's adapter: ``target`` is used as ``target + alpha / rank * A @ B``.

    Attributes:
        target: The base weight's name.
        rank: The rank of ``A @ B``.
        alpha: The scale's numerator (the scale is ``alpha / rank``).
        layout: ``"kernel"`` or ``"transposed"`` (see the module's docstring).
    """

    target: str
    rank: int
    alpha: float
    layout: str = "kernel"

    @property
    def a(self) -> str:
        """``A``'s weight name, ``<target>/lora_a``."""
        return f"{self.target}/lora_a"

    @property
    def b(self) -> str:
        """``B``'s weight name, ``<target>/lora_b``."""
        return f"{self.target}/lora_b"

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def shapes(self, weight_shape: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(A's shape, B's shape)`` for a target of ``weight_shape``."""
        shape = tuple(int(d) for d in weight_shape)
        if self.layout == "transposed":
            return (shape[1], self.rank), (self.rank, shape[0])
        return shape[:-1] + (self.rank,), (self.rank, shape[-1])

    def delta(self, a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
        """``alpha / rank * A @ B`` in the target's layout."""
        product = tf.tensordot(a, b, axes=1) if a.shape.rank != 2 else tf.matmul(a, b)
        if self.layout == "transposed":
            product = tf.transpose(product)
        return tf.cast(self.scale, product.dtype) * product

    def to_json(self) -> list:
        return [self.target, self.rank, self.alpha, self.layout]

    @classmethod
    def from_json(cls, item: Sequence) -> Adapter:
        target, rank, alpha, layout = item
        return cls(str(target), int(rank), float(alpha), str(layout))


# ---------------------------------------------------------------------- which weights are kernels


def candidates(template, weight_names: Iterable[str], shapes: Mapping[str, Sequence[int]]) -> dict[str, str]:
    """The weights an adapter can target, with their layout: ``{weight name: "kernel" | "transposed"}``.

    Args:
        template: The weightless graph (each weight a placeholder named after it).
        weight_names: The graph's weights that may be targets.
        shapes: Each weight's shape.
    """
    consumers: dict[str, list] = {}
    for node in template.node:
        for i, inp in enumerate(node.input):
            if not inp.startswith("^"):
                consumers.setdefault(gu.node_name(inp), []).append((node, i))
    nodes = gu.nodes_by_name(template)
    found = {}
    for name in weight_names:
        rank = len(shapes[name])
        if rank < 2:
            continue
        layout = _layout(name, rank, consumers, nodes)
        if layout is not None:
            found[name] = layout
    return found


def _layout(name: str, rank: int, consumers, nodes) -> str | None:
    """The first matmul or gather the weight reaches decides (None: it reaches neither)."""
    frontier = [(name, False)]  # (node, whether a 2-D weight arrives transposed)
    for _ in range(_MAX_HOPS):
        following = []
        for node_name, flipped in frontier:
            for node, index in consumers.get(node_name, ()):
                if node.op in _MATMULS and index < 2:
                    return _matmul_layout(node, index, rank, flipped)
                if node.op in _GATHERS and index == 0:
                    return "kernel" if rank == 2 and not flipped else None
                if node.op in _PASS_THROUGH and index == 0:
                    following.append((node.name, flipped != _swaps_2d(node, nodes, rank)))
        frontier = following
        if not frontier:
            break
    return None


def _swaps_2d(node, nodes, rank: int) -> bool:
    """Whether a pass-through node turns a 2-D weight around (``Transpose`` with ``perm=[1, 0]``)."""
    if node.op != "Transpose" or rank != 2 or len(node.input) < 2:
        return False
    perm = nodes.get(gu.node_name(node.input[1]))
    if perm is None or perm.op != "Const":
        return False
    return [int(p) for p in np.ravel(gu.const_value(perm))] == [1, 0]


def _matmul_layout(node, index: int, rank: int, flipped: bool) -> str:
    attrs = _MATMULS[node.op]
    if rank != 2 or attrs is None:
        return "kernel"  # Keras's EinsumDense convention: A is W.shape[:-1] + (rank,)
    transposed = node.attr[attrs[index]].b if attrs[index] in node.attr else False
    # the axis of the operand the op contracts: the first operand's last, the second's first
    contracted = (1 if index == 0 else 0) ^ int(bool(transposed)) ^ int(flipped)
    return "kernel" if contracted == 0 else "transposed"


# ---------------------------------------------------------------------- choosing targets


def select_targets(spec, found: Mapping[str, str], weight_names: Sequence[str], taken: Iterable[str] = ()) -> list[str]:
    """The targets ``spec`` picks among the candidates ``found``, in graph order.

    ``spec`` takes what :attr:`tfnet.TFNet.trainable` takes: a prefix string, a list of names, a
    compiled regex, a callable ``name -> bool``, or ``True`` (every candidate). Prefix, regex and
    callable selections skip weights that are not candidates (biases, normalisation scales);
    names given one by one must each be a candidate.

    Raises:
        WeightError: nothing matches, a named weight does not exist or is not a kernel, or a target
            already has an adapter; the message lists the candidates, closest first.
        TypeError: ``spec`` is none of those kinds.
    """
    taken = set(taken)
    pool = [n for n in weight_names if n in found]
    if spec is True:
        chosen = pool
        what = "True"
    elif isinstance(spec, str):
        chosen = [n for n in pool if n.startswith(spec)]
        what = f"the prefix {spec!r}"
    elif isinstance(spec, re.Pattern):
        chosen = [n for n in pool if spec.search(n)]
        what = f"the pattern {spec.pattern!r}"
    elif callable(spec):
        chosen = [n for n in pool if spec(n)]
        what = "the callable"
    elif isinstance(spec, Iterable) and not isinstance(spec, (bytes, Mapping)):
        chosen = [_named_target(n, found, weight_names) for n in spec]
        what = "the names"
    else:
        raise TypeError(
            "`targets` takes a prefix string, a list of names, a compiled regex, a callable or True. "
            f"Received: {spec!r}"
        )
    if not chosen:
        key = spec if isinstance(spec, str) else getattr(spec, "pattern", "")
        raise WeightError(f"No LoRA target matches {what}. " + candidates_message(found, key))
    again = [n for n in chosen if n in taken]
    if again:
        raise WeightError(f"{again} already have adapters; a weight takes one adapter. "
                          "Start from the net before with_lora, or target other weights.")
    return list(dict.fromkeys(chosen))


def _named_target(name, found: Mapping[str, str], weight_names: Sequence[str]) -> str:
    if not isinstance(name, str):
        raise TypeError(f"`targets` names are strings. Received: {name!r}")
    key = name[:-2] if name.endswith(":0") else name
    if key not in weight_names:
        raise WeightError(f"Unknown weight {name!r}. " + candidates_message(found, key))
    if key not in found:
        raise WeightError(f"Weight {name!r} is not a kernel: LoRA applies to {_KINDS}. "
                          + candidates_message(found, key))
    return key


def candidates_message(found: Mapping[str, str], near: str = "") -> str:
    """``"Candidates (N): 'a', 'b', ..."``: the closest to ``near`` first, at most 10 shown."""
    names = list(found)
    if not names:
        return f"This net has no candidate: LoRA applies to {_KINDS}."
    close = closest_names(near, names) if near else []
    shown = close + [n for n in names if n not in close]
    more = f" (and {len(names) - 10} more)" if len(names) > 10 else ""
    return f"Candidates ({len(names)}): " + ", ".join(repr(n) for n in shown[:10]) + more + "."


# ---------------------------------------------------------------------- making and using adapters


def new_adapters(targets: Sequence[str], layouts: Mapping[str, str], shapes: Mapping[str, Sequence[int]],
                 dtypes: Mapping[str, np.dtype], rank: int, alpha, seed: int | None) -> tuple[list[Adapter], dict]:
    """Adapters for ``targets`` and their starting values: ``A`` He-uniform, ``B`` zeros.

    He-uniform as Keras's ``HeUniform``: uniform in ``[-sqrt(6 / fan_in), sqrt(6 / fan_in)]``, with
    ``fan_in`` as Keras computes it for ``A``'s shape. The draws come from one numpy generator seeded
    with ``seed``, target after target.

    Raises:
        ValueError: ``rank`` is not a positive integer, or ``alpha`` not a positive number.
    """
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 1:
        raise ValueError(f"`rank` must be a positive integer. Received: rank={rank!r}")
    if alpha is None:
        alpha = rank
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.number)) or not alpha > 0:
        raise ValueError(f"`alpha` must be a positive number or None (then alpha = rank). Received: alpha={alpha!r}")
    rng = np.random.default_rng(seed)
    adapters, values = [], {}
    for target in targets:
        adapter = Adapter(target, int(rank), float(alpha), layouts[target])
        a_shape, b_shape = adapter.shapes(shapes[target])
        limit = np.sqrt(6.0 / _fan_in(a_shape))
        values[adapter.a] = rng.uniform(-limit, limit, a_shape).astype(dtypes[target])
        values[adapter.b] = np.zeros(b_shape, dtypes[target])
        adapters.append(adapter)
    return adapters, values


def _fan_in(shape: Sequence[int]) -> int:
    """Keras's ``compute_fans`` fan-in: ``shape[0]`` in 2-D; ``shape[-2]`` times the leading sizes above."""
    if len(shape) == 2:
        return int(shape[0])
    return int(shape[-2] * np.prod(shape[:-2]))


def adapted_weights(weights: Sequence[tf.Tensor], plan: Sequence[tuple[int, int, int, Adapter]],
                    count: int) -> list[tf.Tensor]:
    """The graph's weights from all of a net's weights: the first ``count`` (the graph's own), each
    target ``t`` replaced by ``W_t + alpha / rank * A @ B``. ``plan`` holds ``(index of W, index of
    A, index of B, adapter)``."""
    if not plan:
        return list(weights[:count])
    out = list(weights[:count])
    for t, a, b, adapter in plan:
        out[t] = out[t] + adapter.delta(weights[a], weights[b])
    return out


# ---------------------------------------------------------------------- what a checkpoint carries


def carried_weight_names(net) -> list[str]:
    """The weights a checkpoint (or rank 0's result) of ``net`` must carry: every weight for a plain
    net; for a net with adapters, the adapters and the trainable weights (the rest, the frozen base,
    cannot change in training and is named by its :func:`fingerprint`)."""
    adapters = net.adapters
    if not adapters:
        return net.weight_names
    keep = set(net.trainable) | {n for ad in adapters.values() for n in (ad.a, ad.b)}
    return [n for n in net.weight_names if n in keep]


def fingerprint(weights: Mapping[str, np.ndarray]) -> str:
    """SHA-256 over the weights in order: each one's name, dtype, shape and bytes."""
    digest = hashlib.sha256()
    for name, value in weights.items():
        array = np.ascontiguousarray(value)
        digest.update(json.dumps([name, array.dtype.str, list(array.shape)]).encode("utf-8"))
        digest.update(array.reshape(-1).view(np.uint8))
    return digest.hexdigest()

