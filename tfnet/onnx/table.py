"""The table of operators and versions tfnet converts, generated from the handlers' registrations.

``python -m tfnet.onnx.table`` prints it as the Markdown that docs/onnx.md holds (a test checks that the
two agree). For every default-domain operator of the installed onnx: the versions (``since_version``
in ONNX's changelog) converted by a handler, those converted by expanding ONNX's own function
definition of the operator (:mod:`tfnet.onnx.functions`; whether every node of the expansion converts
is checked per model, at load), and those refused.
"""

from __future__ import annotations

from tfnet.onnx.registry import CHECKED_OPSET, HANDLERS, handled_versions, versions_of


def rows() -> list[tuple[str, tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """``(operator, versions a handler converts, versions expanded from ONNX's function, refused
    versions)`` for every default-domain operator up to :data:`CHECKED_OPSET`."""
    from onnx import defs

    from tfnet.onnx.handlers import load_handlers

    load_handlers()
    functions: dict[str, set[int]] = {}
    deprecated: set[str] = set()
    for s in defs.get_all_schemas_with_history():
        if s.domain != "" or s.since_version > CHECKED_OPSET:
            continue
        if s.has_function or s.has_context_dependent_function:
            functions.setdefault(s.name, set()).add(int(s.since_version))
        if s.deprecated:
            deprecated.add(s.name)
    out = []
    for op in sorted({s.name for s in defs.get_all_schemas_with_history() if s.domain == ""}):
        versions = tuple(v for v in versions_of(op) if v <= CHECKED_OPSET)
        if not versions or (op in deprecated and op not in HANDLERS):
            continue
        handled = handled_versions(op)
        expanded = tuple(v for v in versions if v not in handled and v in functions.get(op, ()))
        refused = tuple(v for v in versions if v not in handled and v not in expanded)
        out.append((op, handled, expanded, refused))
    return out


def markdown() -> str:
    """The table as Markdown: one row per operator."""
    def fmt(versions):
        return ", ".join(str(v) for v in versions) or "-"

    lines = ["| operator | converted | from ONNX's function | not converted |", "|---|---|---|---|"]
    for op, handled, expanded, refused in rows():
        lines.append(f"| `{op}` | {fmt(handled)} | {fmt(expanded)} | {fmt(refused)} |")
    return "\n".join(lines)


def main() -> None:
    print(markdown())  # noqa: T201 - the command's output


if __name__ == "__main__":
    main()
