"""A TFNet as an MLflow model: a ``pyfunc`` whose artifact is the net's export (``TFNet.save``), with a signature
and an input example made from the net's inputs. Imported only by :class:`optim.callbacks.MLflowLogger`, so
MLflow is imported only when used.

``mlflow.pyfunc.load_model(uri).predict(data)`` takes a pandas DataFrame with one column per input (named as the
input, without ``:0``; the only column for a one-input net), each cell a row of that input (a number, a string, or
a list of numbers of the input's per-row size, flat or nested), or a dict of arrays by input name, or an array
for a one-input net; it returns ``net.forward``'s outputs (a dict by output name for several).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings

import mlflow
import numpy as np
import pandas as pd

__all__ = ["TFNetPyfunc", "input_example", "log_net", "to_inputs"]


def _short(name: str) -> str:
    return name.split(":")[0]


def to_inputs(data, input_names: list[str], input_specs) -> list[np.ndarray]:
    """What a pyfunc ``predict`` receives, as one array per input (rows first, the input's per-row shape)."""
    if isinstance(data, pd.DataFrame):
        if len(input_names) == 1 and len(data.columns) == 1:
            columns = [data[data.columns[0]]]
        else:
            missing = [_short(n) for n in input_names if _short(n) not in data.columns]
            if missing:
                raise KeyError(f"The DataFrame needs one column per input {[_short(n) for n in input_names]}; missing "
                               f"{missing}. Columns: {list(data.columns)}")
            columns = [data[_short(n)] for n in input_names]
        arrays = []
        for column, spec in zip(columns, input_specs):
            rows = [np.asarray(v) for v in column.tolist()]
            arrays.append(_shaped(np.stack(rows) if rows else np.zeros((0,)), spec))
        return arrays
    if isinstance(data, dict):
        return [_shaped(np.asarray(data[_short(n)] if _short(n) in data else data[n]), s)
                for n, s in zip(input_names, input_specs)]
    return [_shaped(np.asarray(data), input_specs[0])]


def _shaped(a: np.ndarray, spec) -> np.ndarray:
    """``a`` (rows first) reshaped to the input's per-row shape when its rows are flat lists of the right size."""
    row = spec.shape.as_list()[1:] if spec.shape.rank is not None else None
    if row and all(d is not None for d in row) and a.ndim >= 1 and a.shape[1:] != tuple(row):
        size = int(np.prod(row))
        if a.size == len(a) * size:
            a = a.reshape((len(a), *row))
    if spec.dtype.name == "string":
        return a.astype(object)
    return a.astype(spec.dtype.as_numpy_dtype, copy=False)


def input_example(net, rows: int = 2) -> pd.DataFrame:
    """A DataFrame of ``rows`` rows for the net's inputs: zeros (empty strings for string inputs), each cell a row of
    its input, flat."""
    out = {}
    for name, spec in zip(net.input_names, net.input_specs):
        row = [d or 1 for d in (spec.shape.as_list()[1:] if spec.shape.rank is not None else [])]
        if spec.dtype.name == "string":
            cell = "" if not row or row == [1] else [""] * int(np.prod(row))
        else:
            cell = 0.0 if not row else [0.0] * int(np.prod(row))
        out[_short(name)] = [cell] * rows
    return pd.DataFrame(out)


class TFNetPyfunc(mlflow.pyfunc.PythonModel):
    """The pyfunc flavour of a TFNet: loads the export in ``load_context``, runs ``net.forward`` in ``predict``."""

    #: MLflow's switch for classes whose input its type-hint check cannot describe (it warns at class creation
    #: otherwise): the logged signature and input example say what ``predict`` takes
    _skip_type_hint_validation = True

    def load_context(self, context):
        from tfnet import TFNet

        self.net = TFNet.load(context.artifacts["net"])

    def predict(self, context, model_input, params=None):
        net = self.net
        outs = net.forward(to_inputs(model_input, list(net.input_names), list(net.input_specs)))
        if isinstance(outs, list):
            return {_short(n): o for n, o in zip(net.output_names, outs)}
        return outs


def log_net(net, name: str = "model"):
    """Logs ``net`` into the active run as the MLflow model ``name``; returns MLflow's model info."""
    folder = tempfile.mkdtemp(prefix="tfnet-mlflow-")
    with warnings.catch_warnings():  # MLflow asks for type hints on predict; the signature says what it takes
        warnings.filterwarnings("ignore", message=".*type hints", category=UserWarning)
        try:
            return _log(net, name, folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def _log(net, name: str, folder: str):
    from mlflow.models import infer_signature

    export = os.path.join(folder, "net")
    net.save(export)
    example = input_example(net)
    outputs = net.forward(to_inputs(example, list(net.input_names), list(net.input_specs)))
    if isinstance(outputs, list):
        outputs = {_short(n): o for n, o in zip(net.output_names, outputs)}
    signature = infer_signature(example, outputs)
    return mlflow.pyfunc.log_model(name=name, python_model=TFNetPyfunc(), artifacts={"net": export},
                                   signature=signature, input_example=example)
