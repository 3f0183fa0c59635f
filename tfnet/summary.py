"""A TFNet described for a person: ``net.summary()`` (a Keras-style table) and
``net.tensor_names(...)`` (the candidate cut points)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

__all__ = ["summary", "tensor_names"]

# ops that are plumbing, not a place to cut a model
_PLUMBING = {"Const", "Placeholder", "NoOp", "Identity", "IdentityN", "Shape", "StridedSlice", "Pack", "Unpack",
             "Reshape", "ExpandDims", "Squeeze", "Cast", "ConcatV2", "Fill", "Range", "Size", "Rank"}


def tensor_names(net, op_types: Sequence[str] | None = None, contains: str | None = None,
                 include_plumbing: bool = False) -> list[str]:
    """Tensor names in the net's graph, in graph order: where ``net.cut(...)`` can end the net.

    Args:
        op_types: Only tensors of these op types (``["Relu", "MatMul"]``). Default: all but
            plumbing (constants, placeholders, identities, reshapes, shape arithmetic), and the
            net's outputs whatever makes them.
        contains: Only names containing this text (``"block5"``). Default: all.
        include_plumbing: Keep the plumbing ops too. Default: False.
    """
    graph = net.frozen_graph_def()
    wanted = set(op_types) if op_types else None
    outputs = set(net.output_names)  # an output is a cut point even when an Identity makes it
    out = []
    for node in graph.node:
        if wanted is not None and node.op not in wanted:
            continue
        if wanted is None and not include_plumbing and node.op in _PLUMBING and f"{node.name}:0" not in outputs:
            continue
        name = f"{node.name}:0"
        if contains is None or contains in name:
            out.append(name)
    return out


def _row(cols: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(str(c).ljust(w) for c, w in zip(cols, widths)).rstrip()


def _shape(spec) -> str:
    return "(" + ", ".join("None" if d is None else str(d) for d in spec.shape.as_list()) + ")" \
        if spec.shape.rank is not None else "(unknown)"


def summary(net, print_fn: Callable[[str], None] | None = print, line_length: int = 100) -> str:
    """Inputs, outputs and weights (name, shape, values, trainable or not, statistic), with totals
    and the graph's op counts; printed with ``print_fn`` (None: not printed) and returned."""
    lines = []
    rule = "=" * line_length
    lines.append(rule)
    io = [("input", n, _shape(s), s.dtype.name) for n, s in zip(net.input_names, net.input_specs)]
    io += [("output", n, _shape(s), s.dtype.name) for n, s in zip(net.output_names, net.output_specs)]
    widths = [6, max([len(r[1]) for r in io] + [6]), max([len(r[2]) for r in io] + [5]), 8]
    lines.append(_row(["", "tensor", "shape", "dtype"], widths))
    lines += [_row(r, widths) for r in io]
    lines.append(rule)
    trainable, stats = set(net.trainable), set(net.statistic_names)
    rows = []
    total = train_total = 0
    for name, var in net.weight_variables.items():
        n = int(var.shape.num_elements() or 0)
        total += n
        kind = "trainable" if name in trainable else "statistic" if name in stats else "frozen"
        train_total += n if kind == "trainable" else 0
        rows.append((name, "(" + ", ".join(map(str, var.shape.as_list())) + ")", f"{n:,}", kind))
    widths = [max([len(r[0]) for r in rows] + [6]), max([len(r[1]) for r in rows] + [5]),
              max([len(r[2]) for r in rows] + [6]), 9]
    lines.append(_row(["weight", "shape", "values", "kind"], widths))
    lines.append("-" * line_length)
    lines += [_row(r, widths) for r in rows]
    lines.append(rule)
    size = sum(int(v.shape.num_elements() or 0) * v.dtype.size for v in net.weight_variables.values())
    lines.append(f"Total values: {total:,} ({size / 2**20:.2f} MiB)   trainable: {train_total:,}   "
                 f"not trained: {total - train_total:,}   weights: {len(rows)} ({len(trainable)} trainable, "
                 f"{len(stats)} statistics)")
    ops = Counter(node.op for node in net.frozen_graph_def().node if node.op not in ("Const", "Identity"))
    lines.append("Ops: " + ", ".join(f"{op} x{k}" for op, k in ops.most_common(12)) +
                 (f", ... ({len(ops)} kinds)" if len(ops) > 12 else ""))
    lines.append(rule)
    text = "\n".join(lines)
    if print_fn is not None:
        print_fn(text)
    return text
