"""Reading and checking an ONNX model: file or bytes or ``ModelProto``, external data, opset."""

from __future__ import annotations

import os
from typing import Any

from tfnet.errors import first_line
from tfnet.onnx.errors import ExternalDataError, OnnxLoadError, OpsetError
from tfnet.onnx.registry import CHECKED_OPSET, DEFAULT_DOMAINS
from tfnet.onnx.upgrade import upgrade

MIN_OPSET = 1  # each operator's version is checked (tfnet.onnx.registry), not the opset as a whole
MAX_OPSET = CHECKED_OPSET  # the newest opset checked; max_opset() is the newest the installed onnx defines
_DEFAULT_DOMAINS = DEFAULT_DOMAINS


def max_opset() -> int:
    """The newest default-domain opset the installed ``onnx`` defines: tfnet reads models up to it (an
    operator whose version there is newer than those tfnet converts is refused by name and version)."""
    from onnx import defs

    return int(defs.onnx_opset_version())


def read_model(source: Any):
    """Returns a checked ``onnx.ModelProto`` with its external data loaded.

    Args:
        source: A path to a ``.onnx`` file, its bytes, or an ``onnx.ModelProto``.

    Raises:
        FileNotFoundError: the file does not exist.
        ExternalDataError: a tensor's external data file is missing.
        OnnxLoadError: the bytes are not an ONNX model (corrupt, truncated, another format).
        OpsetError: the default-domain opset is outside MIN_OPSET to :func:`max_opset`.

    Functions the model defines itself (``model.functions``, which PyTorch's dynamo exporter may
    write) are inlined. A model with operator versions older than tfnet converts (opsets 1 to 8) is
    upgraded with ``onnx.version_converter`` (:mod:`tfnet.onnx.upgrade`).
    """
    import onnx
    from onnx import external_data_helper

    base_dir = None
    if isinstance(source, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(source)
        what = "the ModelProto"
    elif isinstance(source, (bytes, bytearray)):
        model = _parse(bytes(source), f"the {len(source)} bytes given")
        what = "the bytes given"
    elif isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if not os.path.exists(path):
            raise FileNotFoundError(f"ONNX model file not found: {path!r}")
        if os.path.isdir(path):
            raise OnnxLoadError(f"{path!r} is a folder; from_onnx takes a .onnx file, its bytes or a ModelProto.")
        with open(path, "rb") as f:
            data = f.read()
        model = _parse(data, f"{path!r} ({len(data)} bytes)")
        base_dir = os.path.dirname(os.path.abspath(path))
        what = repr(path)
    else:
        raise TypeError(
            "from_onnx takes a path to a .onnx file, its bytes or an onnx.ModelProto. "
            f"Received: {type(source).__name__}"
        )
    _load_external(model, base_dir, what, external_data_helper)
    opset = check_opset(model)
    try:
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, ValueError) as exc:
        raise OnnxLoadError(
            f"{what} is not a valid ONNX model: {first_line(str(exc))}. Expected a model written by "
            "onnx.save or torch.onnx.export."
        ) from None
    if model.functions:
        from onnx import inliner

        model = inliner.inline_local_functions(model)
    return upgrade(model, opset)


def _parse(data: bytes, what: str):
    import onnx
    from google.protobuf.message import DecodeError

    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise OnnxLoadError(
            f"Could not read {what} as an ONNX model ({first_line(str(exc)) or 'parse error'}): the file is "
            "corrupt, truncated, or not ONNX. Expected a ModelProto written by onnx.save or torch.onnx.export."
        ) from None
    if not model.graph.node and not model.graph.output:
        raise OnnxLoadError(
            f"{what} holds no ONNX graph (no nodes, no outputs): the file is empty, truncated, or not ONNX. "
            "Expected a ModelProto written by onnx.save or torch.onnx.export."
        )
    return model


def _load_external(model, base_dir, what, helper) -> None:
    tensors = [t for t in helper._get_all_tensors(model) if helper.uses_external_data(t)]
    if not tensors:
        return
    if base_dir is None:
        raise ExternalDataError(
            f"{what} stores {len(tensors)} tensor(s) in external data files (first: {tensors[0].name!r}), "
            "and a ModelProto or bytes has no folder to find them in. Pass the path of the .onnx file instead."
        )
    for t in tensors:
        info = helper.ExternalDataInfo(t)
        file = os.path.join(base_dir, info.location)
        if not os.path.isfile(file):
            raise ExternalDataError(
                f"{what}: the external data of tensor {t.name!r} should be in {file!r}, which does not exist. "
                "Keep the data file(s) next to the .onnx file, as onnx.save(..., save_as_external_data=True) wrote them."
            )
    try:
        helper.load_external_data_for_model(model, base_dir)
    except (OSError, ValueError) as exc:
        raise ExternalDataError(f"{what}: reading external data failed: {first_line(str(exc))}") from None


def opset_of(model) -> int | None:
    for entry in model.opset_import:
        if entry.domain in _DEFAULT_DOMAINS:
            return int(entry.version)
    return None


def check_opset(model) -> int:
    """The model's default-domain opset; raises :class:`OpsetError` when it has none or one newer than
    the installed onnx defines. Whether each operator's version converts is checked node by node
    (:func:`tfnet.onnx.convert.missing_operators`)."""
    version = opset_of(model)
    newest = max_opset()
    if version is None:
        raise OpsetError(
            "The ONNX model imports no default-domain opset (its opset_import lists "
            f"{[e.domain for e in model.opset_import]}); tfnet converts the default (ai.onnx) domain, opsets "
            f"{MIN_OPSET} to {newest}."
        )
    if not MIN_OPSET <= version <= newest:
        raise OpsetError(
            f"The ONNX model uses opset {version}; tfnet converts opsets {MIN_OPSET} to {newest}, the newest that "
            f"the installed onnx {_onnx_version()} defines. Upgrade onnx, or re-export with opset_version={newest} "
            "or lower."
        )
    return version


def _onnx_version() -> str:
    import onnx

    return onnx.__version__
