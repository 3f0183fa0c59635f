"""The MLflow model that ``MLflowLogger`` logs (``optim.mlflow_model.log_net``) takes what MLflow's TensorFlow flavor
takes: MLflow's own pyfunc input-type tests for that flavor (``tests/tensorflow/
test_keras_pyfunc_model_works_with_all_input_types.py`` in mlflow: one input, two inputs, one multidimensional input,
two multidimensional inputs), adapted to TFNets made from the same Keras models (float32, Flatten for their Lambda
means), logged into a real MLflow file store and loaded back with ``mlflow.pyfunc.load_model``.

Each kind of input gives the Keras model's own outputs: an array, a dict of arrays, a DataFrame of scalar columns,
of flat lists, and of arrays of the row's shape (nested cells); the tensor-spec signature records each input's dtype
and shape; ``mlflow.models.validate_serving_input`` scores the logged serving example and MLflow's serving payloads
(``inputs``, ``instances``, ``dataframe_split``); ``mlflow.pyfunc.spark_udf`` scores a Spark DataFrame by columns and
by a struct (``result_type="array<float>"``: the type MLflow infers from a tensor spec of shape ``(-1, 1)`` is
``array<array<float>>``, the whole tensor's, where each row is one array)."""

import json
import os

import keras
import mlflow
import numpy as np
import pandas as pd
import pytest
from mlflow.models import validate_serving_input
from mlflow.types import TensorSpec

from optim.mlflow_model import log_net
from tfnet import TFNet

RNG = np.random.default_rng(0)
X = RNG.normal(size=(24, 4)).astype(np.float32)


def dense_head(*inputs):
    flat = [keras.layers.Flatten()(i) if len(i.shape) > 2 else i for i in inputs]
    joined = keras.layers.Concatenate()(flat) if len(flat) > 1 else flat[0]
    return keras.layers.Dense(1)(keras.layers.Dense(3)(joined))


def keras_model(shapes: dict):
    keras.utils.set_random_seed(0)
    inputs = [keras.Input(shape, name=name) for name, shape in shapes.items()]
    return keras.Model(inputs, dense_head(*inputs))


MODELS = {  # MLflow's four models, by their input shapes
    "single": {"x": (4,)},
    "multi": {"a": (2,), "b": (2,)},
    "single_multidim": {"x": (4, 3)},
    "multi_multidim": {"a": (2, 3), "b": (2, 5)},
}
DATA = {  # MLflow's data for them: the features, split and repeated along a new last axis
    "single": {"x": X},
    "multi": {"a": X[:, :2], "b": X[:, -2:]},
    "single_multidim": {"x": np.repeat(X[:, :, None], 3, axis=2)},
    "multi_multidim": {"a": np.repeat(X[:, :2, None], 3, axis=2), "b": np.repeat(X[:, -2:, None], 5, axis=2)},
}


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """Each model logged into one run of a file store: ``{kind: (model info, pyfunc, Keras's outputs)}``."""
    folder = tmp_path_factory.mktemp("mlflow")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        mlflow.set_tracking_uri("file:" + str(folder / "mlruns"))
        try:
            out = {}
            # an experiment of this store (the active one may be an earlier test's, in another store), made without
            # mlflow.set_experiment: that would make it the process's active experiment (and MLFLOW_EXPERIMENT_ID) for
            # every later test, whose new runs in other stores then look for it there and fail (test_distributed.py's
            # MLflowLogger run did, right after this module)
            experiment_id = mlflow.tracking.MlflowClient().create_experiment("tfnet-model-inputs")
            with mlflow.start_run(experiment_id=experiment_id):
                for kind, shapes in MODELS.items():
                    model = keras_model(shapes)
                    expected = np.asarray(model([DATA[kind][n] for n in shapes]))
                    info = log_net(TFNet.from_keras(model), kind)
                    out[kind] = (info, mlflow.pyfunc.load_model(info.model_uri), expected)
            yield out
        finally:
            mlflow.set_tracking_uri("")


def close(actual, expected):
    assert isinstance(actual, np.ndarray), type(actual)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


def flat(a: np.ndarray) -> list:
    return a.reshape(len(a), -1).tolist()


def test_the_signature_is_tensor_specs_with_the_inputs_shapes(logged):
    inputs = {kind: logged[kind][0].signature.inputs.inputs for kind in MODELS}
    assert inputs["single"] == [TensorSpec(np.dtype(np.float32), (-1, 4))]
    assert inputs["multi"] == [TensorSpec(np.dtype(np.float32), (-1, 2), "a"),
                               TensorSpec(np.dtype(np.float32), (-1, 2), "b")]
    assert inputs["single_multidim"] == [TensorSpec(np.dtype(np.float32), (-1, 4, 3))]
    assert inputs["multi_multidim"] == [TensorSpec(np.dtype(np.float32), (-1, 2, 3), "a"),
                                        TensorSpec(np.dtype(np.float32), (-1, 2, 5), "b")]
    assert logged["single"][0].signature.outputs.inputs == [TensorSpec(np.dtype(np.float32), (-1, 1))]


def test_the_requirements_pin_what_the_net_loads_with(logged):
    """tfnet's own pins (tfnet, TensorFlow, cloudpickle), as MLflow's flavors give theirs, not MLflow's inference: that
    loads the model in a fresh process to see what it imports, and drops TensorFlow as a dependency of tfnet."""
    from importlib import metadata

    import tensorflow as tf

    for kind in MODELS:
        with open(mlflow.pyfunc.get_model_dependencies(logged[kind][0].model_uri)) as f:
            lines = [line.strip() for line in f if line.strip()]
        assert lines == [f"mlflow=={mlflow.__version__}", f"tfnet=={metadata.version('tfnet')}",
                         f"tensorflow-cpu=={tf.__version__}", f"cloudpickle=={metadata.version('cloudpickle')}"], kind


def test_model_single_tensor_input(logged):
    _, model, expected = logged["single"]
    close(model.predict(pd.DataFrame(X, columns=["f0", "f1", "f2", "f3"])), expected)  # one column per feature
    close(model.predict(X), expected)
    close(model.predict(pd.DataFrame({"x": X.tolist()})), expected)


def test_model_multi_tensor_input(logged):
    _, model, expected = logged["multi"]
    data = DATA["multi"]
    close(model.predict(data), expected)
    close(model.predict(pd.DataFrame({"a": data["a"].tolist(), "b": data["b"].tolist()})), expected)


def test_model_single_multidim_tensor_input(logged):
    _, model, expected = logged["single_multidim"]
    x = DATA["single_multidim"]["x"]
    close(model.predict(x), expected)
    close(model.predict(pd.DataFrame({"x": flat(x)})), expected)
    close(model.predict(pd.DataFrame({"x": list(x)})), expected)  # nested cells: arrays of shape (4, 3)


def test_model_multi_multidim_tensor_input(logged):
    _, model, expected = logged["multi_multidim"]
    a, b = DATA["multi_multidim"]["a"], DATA["multi_multidim"]["b"]
    close(model.predict({"a": a, "b": b}), expected)
    close(model.predict(pd.DataFrame({"a": flat(a), "b": flat(b)})), expected)
    close(model.predict(pd.DataFrame({"a": list(a), "b": list(b)})), expected)


def test_an_input_of_another_shape_is_refused_by_the_signature(logged):
    _, model, _ = logged["single_multidim"]
    with pytest.raises(mlflow.exceptions.MlflowException, match=r"Shape of input \(24, 3, 4\) does not match "
                                                                 r"expected shape \(-1, 4, 3\)"):
        model.predict(DATA["single_multidim"]["x"].transpose(0, 2, 1).copy())


@pytest.mark.parametrize("kind", list(MODELS))
def test_serving_payloads_validate_and_score(logged, kind):
    info, _, expected = logged[kind]
    data = DATA[kind]
    # the serving example MLflow wrote beside the model: the input example (zeros), as serving takes it
    folder = mlflow.artifacts.download_artifacts(info.model_uri)
    example = open(os.path.join(folder, "serving_input_example.json")).read()
    zeros = {name: np.zeros((2, *shape), np.float32) for name, shape in MODELS[kind].items()}
    one = len(data) == 1
    assert json.loads(example) == {"inputs": zeros["x"].tolist() if one else {k: v.tolist() for k, v in zeros.items()}}
    close(np.asarray(validate_serving_input(info.model_uri, example)),
          np.asarray(keras_model(MODELS[kind])(list(zeros.values()))))
    payloads = [
        {"inputs": next(iter(data.values())).tolist() if one else {k: v.tolist() for k, v in data.items()}},
        {"instances": next(iter(data.values())).tolist() if one else
         [{k: v[i].tolist() for k, v in data.items()} for i in range(len(X))]},
        {"dataframe_split": {"columns": list(data), "data": [[flat(v)[i] for v in data.values()] for i in range(len(X))]}},
    ]
    for payload in payloads:
        close(np.asarray(validate_serving_input(info.model_uri, json.dumps(payload))), expected)


@pytest.mark.spark
def test_spark_udf_scores_by_columns_and_by_struct(logged, spark):
    from mlflow.pyfunc import spark_udf
    from pyspark.sql.functions import struct

    info, _, expected = logged["single_multidim"]
    df = spark.createDataFrame(pd.DataFrame({"x": flat(DATA["single_multidim"]["x"])}))
    udf = spark_udf(spark, info.model_uri, env_manager="local", result_type="array<float>")
    got = np.array([list(r.prediction) for r in df.select(udf("x").alias("prediction")).collect()])
    close(got, expected)

    info, _, expected = logged["multi_multidim"]
    a, b = DATA["multi_multidim"]["a"], DATA["multi_multidim"]["b"]
    df = spark.createDataFrame(pd.DataFrame({"a": flat(a), "b": flat(b)}))
    udf = spark_udf(spark, info.model_uri, env_manager="local", result_type="array<float>")
    for column in (udf("a", "b"), udf(struct("a", "b"))):
        got = np.array([list(r.prediction) for r in df.select(column.alias("prediction")).collect()])
        close(got, expected)
