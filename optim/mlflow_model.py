"""A TFNet as an MLflow model, and its training data as an MLflow dataset. Imported only by
:class:`optim.callbacks.MLflowLogger`, so MLflow is imported only when used.

The model is a ``pyfunc`` whose artifact is the net's export (``TFNet.save``), under a tensor-spec signature as
MLflow's TensorFlow flavor writes it (``mlflow.types.TensorSpec``: the dtype and shape of each input and output,
``-1`` for the batch; unnamed for a one-input or one-output net, else by name without ``:0``) with an input example
of the same kind (an array, or a dict of arrays). ``mlflow.pyfunc.load_model(uri).predict(data)`` then takes what
the TensorFlow flavor takes, MLflow's schema enforcement checking it first:

- an array of the input's shape (a one-input net) or a dict of them by input name; arrays keep their dtype, which
  must be the input's;
- a pandas DataFrame with one column per input (named as the input; any name for a one-input net), each cell a row:
  a flat list of the row's values (cast to the input's dtype), or an array of the row's shape, flat or not;

and gives ``net.forward``'s outputs (a dict of arrays by output name for several). Serving (``mlflow models
serve``, ``mlflow.models.validate_serving_input``) and ``mlflow.pyfunc.spark_udf`` go through the same enforcement.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import warnings

import mlflow
import numpy as np
import pandas as pd

__all__ = ["TFNetPyfunc", "dataset_input", "default_pip_requirements", "input_example", "log_net", "signature",
           "to_inputs"]


def _short(name: str) -> str:
    return name.split(":")[0]


def to_inputs(data, input_names: list[str], input_specs) -> list[np.ndarray]:
    """What a pyfunc ``predict`` receives (after MLflow's enforcement: an array or a dict of arrays; a DataFrame
    when called directly), as one array per input (rows first, the input's per-row shape)."""
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


def _numpy_dtype(spec) -> np.dtype:
    return np.dtype(object) if spec.dtype.name == "string" else np.dtype(spec.dtype.as_numpy_dtype)


def _dims(spec, example: np.ndarray | None = None) -> tuple[int, ...]:
    """A TensorSpec's shape: ``-1`` for the batch and each unknown size; an unknown rank from ``example``."""
    if spec.shape.rank is None:
        return (-1, *example.shape[1:]) if example is not None else (-1,)
    return (-1, *(-1 if d is None else d for d in spec.shape.as_list()[1:]))


def _tensor_schema(names: list[str], specs, examples=None):
    from mlflow.types import Schema, TensorSpec

    examples = examples or [None] * len(specs)
    if len(specs) == 1:
        return Schema([TensorSpec(_numpy_dtype(specs[0]), _dims(specs[0], examples[0]))])
    return Schema([TensorSpec(_numpy_dtype(s), _dims(s, e), _short(n)) for n, s, e in zip(names, specs, examples)])


def signature(net, outputs: list[np.ndarray] | None = None):
    """The net's MLflow signature: tensor specs of its inputs and outputs (``outputs``: the example's, for an
    output of unknown rank)."""
    from mlflow.models import ModelSignature

    return ModelSignature(inputs=_tensor_schema(list(net.input_names), list(net.input_specs)),
                          outputs=_tensor_schema(list(net.output_names), list(net.output_specs), outputs))


def input_example(net, rows: int = 2):
    """``rows`` rows of zeros (empty strings for a string input) for the net's inputs, a size of 1 where a size is
    unknown: an array for a one-input net, else a dict of arrays by input name."""
    out = {}
    for name, spec in zip(net.input_names, net.input_specs):
        row = [d or 1 for d in (spec.shape.as_list()[1:] if spec.shape.rank is not None else [])]
        out[_short(name)] = (np.full((rows, *row), "", dtype=object) if spec.dtype.name == "string"
                             else np.zeros((rows, *row), _numpy_dtype(spec)))
    return next(iter(out.values())) if len(out) == 1 else out


class TFNetPyfunc(mlflow.pyfunc.PythonModel):
    """The pyfunc flavour of a TFNet: loads the export in ``load_context``, runs ``net.forward`` in ``predict``."""

    #: MLflow's switch for classes whose input its type-hint check cannot describe (it warns at class creation
    #: otherwise): the logged signature and input example say what ``predict`` takes
    _skip_type_hint_validation = True

    def load_context(self, context):
        from tfnet import TFNet

        self.net = TFNet.load(context.artifacts["net"])

    def predict(self, context, model_input, params=None):
        return _forward(self.net, model_input)


def _forward(net, data):
    outs = net.forward(to_inputs(data, list(net.input_names), list(net.input_specs)))
    if isinstance(outs, list):
        return {_short(n): o for n, o in zip(net.output_names, outs)}
    return outs


def default_pip_requirements() -> list[str]:
    """What a logged net needs to load, pinned to this environment's versions, as MLflow's own flavors give theirs
    (``mlflow.tensorflow.get_default_pip_requirements``): tfnet (when installed as a package), the TensorFlow it
    runs on and cloudpickle (the pyfunc's wrapper is pickled); MLflow adds itself.

    Given to MLflow instead of its inference, which loads the model in a fresh Python process to see what it
    imports (TensorFlow's import: 5-15 s for each logged model) and then drops TensorFlow as a dependency of tfnet
    while keeping whatever else tfnet's import pulled in."""
    from importlib import metadata

    pins = []
    for names in (("tfnet",), ("tensorflow-cpu", "tensorflow"), ("cloudpickle",)):
        for name in names:
            try:
                pins.append(f"{name}=={metadata.version(name)}")
                break
            except metadata.PackageNotFoundError:
                continue
    return pins


def log_net(net, name: str = "model", step: int = 0, pip_requirements: list[str] | None = None):
    """Logs ``net`` into the active run as the MLflow model ``name``, the run's output at ``step``; returns
    MLflow's model info.

    MLflow copies the run's metrics at ``step`` to the model (into the run's own series too, with a file store):
    give a step that has none. ``pip_requirements``: the model's requirements (MLflow's argument); default
    :func:`default_pip_requirements`."""
    folder = tempfile.mkdtemp(prefix="tfnet-mlflow-")
    requirements = default_pip_requirements() if pip_requirements is None else list(pip_requirements)
    with warnings.catch_warnings():  # MLflow asks for type hints on predict; the signature says what it takes
        warnings.filterwarnings("ignore", message=".*type hints", category=UserWarning)
        try:
            return _log(net, name, folder, step, requirements)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def _log(net, name: str, folder: str, step: int, requirements: list[str]):
    export = os.path.join(folder, "net")
    net.save(export)
    example = input_example(net)
    outputs = net.forward(to_inputs(example, list(net.input_names), list(net.input_specs)))
    outputs = outputs if isinstance(outputs, list) else [outputs]
    return mlflow.pyfunc.log_model(name=name, python_model=TFNetPyfunc(), artifacts={"net": export},
                                   signature=signature(net, outputs), input_example=example, step=int(step),
                                   pip_requirements=requirements)


# ---- the training data as an MLflow dataset


def dataset_input(data):
    """The training data as an MLflow dataset (``mlflow.data``), or None for data that has none:

    - a Delta table (``TFDataset.from_delta``): its path and the version read (``DeltaDatasetSource``);
    - Parquet files (``from_parquet``): their path (MLflow's source for the path's scheme), the digest over the
      files read and their rows;
    - a Spark DataFrame (``from_dataframe``): the code that made it (``CodeDatasetSource``, as
      ``mlflow.data.from_spark`` records a DataFrame of no table), the digest from its plan's semantic hash (no
      Spark job);
    - numpy arrays: ``mlflow.data.from_numpy`` (features, and targets when there are labels).

    Only attributes of the dataset are read: nothing is read from the data itself but the arrays' hash."""
    from mlflow.data.meta_dataset import MetaDataset

    kind = type(data).__name__
    if kind == "DeltaDataset":
        path = str(data.path)
        return MetaDataset(_delta_source(path, int(data.version)), name=_base(path))
    if kind == "ParquetDataset":
        path = str(data.path)
        rows = [int(r) for r in getattr(data, "file_rows", [])]
        digest = _digest([list(getattr(data, "files", [])), rows])
        return MetaDataset(_path_source(path), name=_base(path), digest=digest)
    if kind == "DataFrameDataset":
        from mlflow.data.code_dataset_source import CodeDatasetSource
        from mlflow.tracking.context import registry

        return MetaDataset(CodeDatasetSource(tags=registry.resolve_tags()), name="dataframe",
                           digest=_digest([int(data.df.semanticHash()), sorted(getattr(data, "types", {}).items())]))
    if kind == "ArrayDataset":
        import mlflow.data

        features = list(data.features)
        labels = list(data.labels or [])
        return mlflow.data.from_numpy(features[0] if len(features) == 1 else
                                      {f"input_{i}": a for i, a in enumerate(features)},
                                      targets=(labels[0] if len(labels) == 1 else
                                               {f"label_{i}": a for i, a in enumerate(labels)} if labels else None),
                                      name="arrays")
    return None


def _delta_source(path: str, version: int):
    """MLflow's source for a Delta table at a version, version 0 included (MLflow's own leaves a version 0 out of its
    JSON: it tests the version for truth)."""
    from mlflow.data.delta_dataset_source import DeltaDatasetSource

    class _DeltaSource(DeltaDatasetSource):
        def to_dict(self):
            return {**super().to_dict(), "delta_table_version": self.delta_table_version}

    return _DeltaSource(path=path, delta_table_version=version)


def _path_source(path: str):
    """MLflow's dataset source for a path: its own for the scheme (``s3://``, ``gs://``, ...; ``local`` for a local
    path)."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source

    with warnings.catch_warnings():  # "can be interpreted in multiple ways": MLflow takes the first, as wanted
        warnings.simplefilter("ignore", UserWarning)
        return resolve_dataset_source(path)


def _base(path: str) -> str:
    return os.path.basename(path.rstrip("/")) or path


def _digest(parts) -> str:
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:8]
