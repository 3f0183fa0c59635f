"""TFPredictor without Spark: local prediction, the OpenVINO backend and its fallback, column
planning against a schema, Arrow conversion with bad rows, and every error message."""

from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf
from pyspark.sql import types as T

from optim import TFPredictor
from optim.arrow import array_to_arrow, decode_image, read_column
from optim.errors import (
    BackendError,
    BackendFallbackWarning,
    BackendUnavailableError,
    BadRowError,
    ColumnError,
)
from optim.predict.backends import unsupported_ops
from optim.predict.columns import InputColumn, plan_columns
from optim.predict.snapshot import ModelSnapshot, TensorInfo
from tests import models
from tfnet import InputSpecError, InputTypeError, TensorNameError, TFNet


@pytest.fixture(scope="module")
def cnn():
    return TFNet.from_keras(models.small_cnn())


@pytest.fixture(scope="module")
def two():
    return TFNet.from_keras(models.two_in_two_out())


def lgamma_graph():
    """A graph with a weight and an op OpenVINO has no conversion rule for (Lgamma)."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        w = tf.constant(np.linspace(-1, 1, 12, dtype="float32").reshape(4, 3), name="w")
        tf.math.lgamma(tf.abs(tf.matmul(x, w)) + 1.0, name="y")
    return g.as_graph_def()


# ---------------------------------------------------------------------------- local prediction


def test_local_predict_equals_forward(cnn):
    x = models.random_images(70, 8)
    p = TFPredictor(cnn, batch_per_thread=32)
    # batches of 32, 32 and 6 against one of 70: oneDNN may sum in another order for another batch shape (AVX2
    # CPUs do: 3 of 140 values one float32 rounding apart), so equal within a few roundings, not bit for bit
    np.testing.assert_allclose(p.predict(x), cnn.forward(x), rtol=1e-6, atol=1e-7)
    assert p.stats()["calls"] == 3 and p.stats()["max_rows"] == 32 and p.stats()["rows"] == 70
    seconds = p.stats()["seconds"]  # locally only the engine runs: nothing goes through Arrow
    assert seconds["engine"] > 0 and seconds["read"] == seconds["write"] == 0


def test_local_predict_several_inputs_and_outputs(two):
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(9, 5)).astype("float32"), rng.normal(size=(9, 3)).astype("float32")
    p = TFPredictor(two, batch_per_thread=4)
    want = two.forward([a, b])
    for got in (p.predict([a, b]), p.predict({"b": b, "a": a})):
        assert len(got) == 2
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_from_paths(cnn, tmp_path):
    x = models.random_images(5, 8)
    cnn.save(tmp_path / "export")
    tf.io.write_graph(cnn.frozen_graph_def(), str(tmp_path), "frozen.pb", as_text=False)
    for p in (TFPredictor(str(tmp_path / "export")),
              TFPredictor(str(tmp_path / "frozen.pb"), inputs="img", outputs="fc")):
        np.testing.assert_allclose(p.predict(x), cnn.forward(x), rtol=1e-6, atol=1e-6)


def test_weights_are_copied_when_made(cnn):
    net = TFNet.from_keras(models.small_cnn(seed=1))
    x = models.random_images(4, 8)
    p = TFPredictor(net)
    before = net.forward(x)
    net.set_weights({"fc/bias": net.get_weights(["fc/bias"])["fc/bias"] + 1.0})
    np.testing.assert_array_equal(p.predict(x), before)


# ---------------------------------------------------------------------------- OpenVINO


@pytest.mark.parametrize("build,train_batch_norm", [(models.small_cnn, False), (models.two_in_two_out, False),
                                                    (lambda: models.mobilenet_v2(32), False),
                                                    (lambda: models.mobilenet_v2(32), True)],
                         ids=["small_cnn", "two_in_two_out", "mobilenet_v2", "mobilenet_v2-bn-switched"])
def test_openvino_equals_tensorflow(build, train_batch_norm):
    """``train_batch_norm``: frozen as ``TFOptimizer.from_keras`` freezes a model, each batch norm a switch for
    training (tfnet.keras_training), which the served snapshot takes out."""
    net = TFNet.from_keras(build(), train_batch_norm=train_batch_norm)
    rng = np.random.default_rng(1)
    inputs = [rng.uniform(-1, 1, (11, *s.shape[1:])).astype("float32") for s in net.input_specs]
    ov = TFPredictor(net, batch_per_thread=8, backend="openvino")
    assert ov.backend == "openvino"
    got, want = ov.predict(inputs), net.forward(inputs)
    got, want = (got, want) if isinstance(got, list) else ([got], [want])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
        assert models.rel_err(g, w) < 1e-5


@pytest.mark.parametrize("backend", ["tensorflow", "openvino"])
def test_uint8_and_float_inputs_in_turn_each_equal_forward(cnn, backend):
    """uint8 pixels reach the engine as uint8 (OpenVINO: a model compiled with its pre-processing cast), float32
    pixels as float32, in either order on the one cached engine: the uint8 variant must not change the model the
    float32 one is compiled from (it did: the float32 rows were then read as uint8, every output the same)."""
    x8 = np.random.default_rng(0).integers(0, 256, (40, 8, 8, 3)).astype(np.uint8)
    xf = models.random_images(40, 8, seed=3)  # fractions in [-1, 1]: a uint8 reading of them is far off
    p = TFPredictor(cnn, batch_per_thread=16, backend=backend)
    tol = 1e-6 if backend == "tensorflow" else 1e-4
    for x in (x8, xf, x8, xf):
        before = p.stats()["input_bytes"]
        np.testing.assert_allclose(p.predict(x), cnn.forward(x), rtol=tol, atol=tol)
        assert p.stats()["input_bytes"] - before == x.nbytes  # as given: a byte a value for uint8


def test_openvino_falls_back_naming_the_op():
    net = TFNet.from_frozen_graph(lgamma_graph(), "x", "y")
    with pytest.warns(BackendFallbackWarning, match=r"unsupported operation\(s\): Lgamma\. Falling back"):
        p = TFPredictor(net, backend="openvino")
    assert p.backend == "tensorflow" and p.requested_backend == "openvino"
    x = np.random.default_rng(0).normal(size=(6, 4)).astype("float32")
    np.testing.assert_allclose(p.predict(x), net.forward(x), rtol=1e-6)


def test_unsupported_ops_parses_openvino_messages():
    assert unsupported_ops("Summary:\n-- No conversion rule found for operations: Cholesky, MatrixDiagV3\nTo") == [
        "Cholesky", "MatrixDiagV3"]
    assert unsupported_ops("Failed operations detailed log:\n-- FFT with a message:\nbad") == ["FFT"]
    assert unsupported_ops("something else") == []


def test_openvino_missing_is_a_clear_error(cnn, monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # `import openvino` now raises ImportError
    with pytest.raises(BackendUnavailableError, match=r"pip install tfnet\[openvino\]"):
        TFPredictor(cnn, backend="openvino")


# ---------------------------------------------------------------------------- argument errors


@pytest.mark.parametrize("kwargs, error, match", [
    ({"batch_per_thread": 0}, ValueError, r"`batch_per_thread` must be a positive integer. Received: batch_per_thread=0"),
    ({"batch_per_thread": 2.5}, ValueError, r"Received: batch_per_thread=2.5"),
    ({"backend": "onnx"}, BackendError, r"`backend` must be one of \['tensorflow', 'openvino'\]. Received: backend='onnx'"),
    ({"on_error": "skip"}, ValueError, r"`on_error` must be one of \['raise', 'null'\]. Received: on_error='skip'"),
    ({"num_threads": 0}, ValueError, r"`num_threads` must be a positive integer or None. Received: num_threads=0"),
    ({"error_col": ""}, ValueError, r"`error_col` must be a non-empty column name"),
])
def test_bad_arguments(cnn, kwargs, error, match):
    with pytest.raises(error, match=match):
        TFPredictor(cnn, **kwargs)


def test_bad_sources(cnn, tmp_path):
    with pytest.raises(TypeError, match=r"TFPredictor takes a tfnet.TFNet.*Received: int"):
        TFPredictor(3)
    tf.io.write_graph(cnn.frozen_graph_def(), str(tmp_path), "frozen.pb", as_text=False)
    with pytest.raises(TensorNameError, match=r"pass `inputs` and `outputs`.*Placeholders in the graph: \['img'\]"):
        TFPredictor(str(tmp_path / "frozen.pb"))
    with pytest.raises(FileNotFoundError):
        TFPredictor(str(tmp_path / "missing.pb"), inputs="img", outputs="fc")


def test_local_input_errors(cnn):
    p = TFPredictor(cnn)
    with pytest.raises(InputSpecError, match=r"Input 'img:0' expects shape \(None, 8, 8, 3\); received shape \(2, 8, 8, 4\)"):
        p.predict(np.zeros((2, 8, 8, 4), "float32"))
    with pytest.raises(InputTypeError, match=r"expects dtype float32.*received dtype str32"):
        p.predict(np.full((2, 8, 8, 3), "a"))
    with pytest.raises(ColumnError, match=r"feature_cols and output_cols apply to DataFrames; received a ndarray"):
        p.predict(np.zeros((2, 8, 8, 3), "float32"), feature_cols=["img"])


# ---------------------------------------------------------------------------- column planning


IMG = TensorInfo("img:0", "float32", (8, 8, 3))
VEC = TensorInfo("a:0", "float32", (5,))
ONE = TensorInfo("s:0", "float32", (1,))
OUT = TensorInfo("fc:0", "float32", (2,))
SCHEMA = T.StructType([
    T.StructField("id", T.LongType()),
    T.StructField("img", T.ArrayType(T.FloatType())),
    T.StructField("nested", T.ArrayType(T.ArrayType(T.ArrayType(T.DoubleType())))),
    T.StructField("twice", T.ArrayType(T.ArrayType(T.FloatType()))),
    T.StructField("words", T.ArrayType(T.StringType())),
    T.StructField("jpeg", T.BinaryType()),
    T.StructField("x", T.DoubleType()),
    T.StructField("m", T.MapType(T.StringType(), T.FloatType())),
])


def test_plan_defaults_and_kinds():
    plan = plan_columns(SCHEMA, [IMG], [OUT])
    assert [(c.column, c.kind, c.depth) for c in plan.inputs] == [("img", "array", 1)]
    assert [c.column for c in plan.outputs] == ["output"] and plan.error_col is None
    assert plan_columns(SCHEMA, [IMG], [OUT], "nested").inputs[0].depth == 3
    assert plan_columns(SCHEMA, [IMG], [OUT], {"img": "jpeg"}).inputs[0].kind == "image"
    assert plan_columns(SCHEMA, [ONE], [OUT], ["x"]).inputs[0].kind == "scalar"
    two = plan_columns(SCHEMA, [IMG, ONE], [OUT, TensorInfo("y2:0", "float32", ())], ["img", "x"], None, "err")
    assert [c.column for c in two.outputs] == ["fc", "y2"]
    fields = two.output_fields()
    assert [f.name for f in fields] == ["fc", "y2", "err"]
    assert fields[0].dataType == T.ArrayType(T.FloatType(), False) and fields[1].dataType == T.FloatType()


@pytest.mark.parametrize("inputs, feature_cols, output_cols, error_col, match", [
    ([VEC], None, None, None, r"feature_cols was not given, and the DataFrame has no column 'a' for input 'a:0'"),
    ([IMG], ["imgg"], None, None, r"Unknown column 'imgg'. Closest existing names: 'img'.*for input 'img:0'"),
    ([IMG], ["img", "x"], None, None, r"`feature_cols` must name 1 column\(s\), one per tensor \['img:0'\]; received 2"),
    ([IMG], {"image": "img"}, None, None, r"Unknown feature_cols key \(tensor name\) 'image'"),
    ([IMG], 3, None, None, r"`feature_cols` must be a column name, a list of names or a dict by tensor name. Received: 3"),
    ([IMG], ["words"], None, None, r"Column 'words' \(array<string>\) cannot feed input 'img:0' \(float32, per-row shape \(8, 8, 3\)\): its elements are string"),
    ([IMG], ["twice"], None, None, r"it is nested 2 deep; use a flat array or one nested 3 deep"),
    ([VEC], ["jpeg"], None, None, r"binary columns hold encoded images, which need an input of per-row shape \(height, width, channels\)"),
    ([VEC], ["x"], None, None, r"a number per row feeds only an input with one value per row. That input takes an array column of 5 numbers"),
    ([IMG], ["m"], None, None, r"this column type is not supported \(for ML vectors, convert with pyspark.ml.functions.vector_to_array"),
    ([TensorInfo("t:0", "float32", (None, 3))], ["img"], None, None, r"per-row shape is not fully known"),
    ([IMG], None, ["id"], None, r"Output column 'id' already exists in the DataFrame; every input column is kept"),
    ([IMG], None, None, "img", r"Output column 'img' already exists"),
    ([IMG], None, ["prediction_error"], "prediction_error", r"Output column 'prediction_error' is used twice"),
])
def test_plan_errors(inputs, feature_cols, output_cols, error_col, match):
    with pytest.raises(ColumnError, match=match):
        plan_columns(SCHEMA, inputs, [OUT], feature_cols, output_cols, error_col)


# ---------------------------------------------------------------------------- Arrow conversion


def test_array_column_bad_rows_and_slices():
    spec = InputColumn("v", TensorInfo("v:0", "float32", (2, 3)), "array", 1)
    col = pa.array([[1, 2, 3, 4, 5, 6], None, [1, 2, 3], [6, 5, 4, 3, 2, 1], [1, 2, 3, 4, None, 6]],
                   pa.list_(pa.float64()))
    out, bad = read_column(col, spec.reading)
    bad = {r: p.text for r, p in bad.items()}
    assert out.shape == (5, 2, 3) and out.dtype == np.float32
    np.testing.assert_array_equal(out[3].ravel(), [6, 5, 4, 3, 2, 1])
    assert bad == {1: "the value is null",
                   2: "the array has 3 values; input 'v:0' needs 6 (per-row shape (2, 3))",
                   4: "the array holds a null value"}
    out, bad = read_column(col.slice(3, 2), spec.reading)  # offsets of a slice do not start at 0
    bad = {r: p.text for r, p in bad.items()}
    np.testing.assert_array_equal(out[0].ravel(), [6, 5, 4, 3, 2, 1])
    assert bad == {1: "the array holds a null value"}


def test_nested_array_column_bad_rows():
    spec = InputColumn("v", TensorInfo("v:0", "float32", (2, 3)), "array", 2)
    col = pa.array([[[1, 2, 3], [4, 5, 6]], [[1, 2], [3, 4, 5, 6]], [[1, 2, 3], None], None, [[0, 1, 2], [3, 4, 5]]],
                   pa.list_(pa.list_(pa.float32())))
    out, bad = read_column(col, spec.reading)
    bad = {r: p.text for r, p in bad.items()}
    np.testing.assert_array_equal(out[4].ravel(), np.arange(6))
    assert bad == {1: "dimension 1 has length 2, expected 3 (per-row shape (2, 3))",
                   2: "a nested array inside it is null", 3: "the value is null"}


def test_image_column_bad_rows():
    from sklearn.datasets import load_sample_images

    jpeg = open(load_sample_images().filenames[0], "rb").read()
    spec = InputColumn("jpeg", TensorInfo("img:0", "float32", (16, 24, 3)), "image")
    out, bad = read_column(pa.array([jpeg, None, b"", b"not an image", jpeg[:200]], pa.binary()), spec.reading)
    bad = {r: p.text for r, p in bad.items()}
    assert out.shape == (5, 16, 24, 3) and 0 <= out.min() and out.max() <= 255 and out[0].std() > 10
    assert bad[1] == "the value is null" and bad[2] == "the image is empty (0 bytes)"
    assert bad[3].startswith("the image could not be decoded (12 bytes; JPEG, PNG, GIF, BMP or WebP expected, or 1152 "
                             "bytes of raw uint8 pixels): Unknown image file format")
    assert "could not be decoded (200 bytes" in bad[4]


def test_decode_image_matches_pillow_and_resizes():
    from sklearn.datasets import load_sample_images

    images = load_sample_images()
    for path, pixels in zip(images.filenames, images.images):
        data = open(path, "rb").read()
        np.testing.assert_array_equal(decode_image(data, *pixels.shape), pixels)  # no resize: same pixels
        small = decode_image(data, 32, 48, 3)
        np.testing.assert_allclose(small, tf.image.resize(pixels, (32, 48)).numpy(), atol=1e-3)
        png = tf.io.encode_png(pixels).numpy()
        np.testing.assert_array_equal(decode_image(png, *pixels.shape, dtype=np.uint8), pixels)


def test_outputs_to_arrow_with_nulls():
    valid = np.array([True, False, True])
    nested = array_to_arrow(np.arange(12, dtype="float32").reshape(3, 2, 2), valid, "float32")
    assert nested.to_pylist() == [[[0, 1], [2, 3]], None, [[8, 9], [10, 11]]]
    assert array_to_arrow(np.arange(3.0), valid, "float32").to_pylist() == [0, None, 2]
    assert array_to_arrow(np.arange(3), None, "int64").type == pa.int64()


def test_snapshot_save_and_load(cnn, tmp_path):
    snap = ModelSnapshot.from_net(cnn)
    snap.save(tmp_path / "m")
    again = ModelSnapshot.load(tmp_path / "m")
    assert again.inputs == snap.inputs and again.outputs == snap.outputs and again.graph == snap.graph
    assert again.model_id == snap.model_id
    x = models.random_images(3, 8)
    np.testing.assert_allclose(TFNet.load(tmp_path / "m").forward(x), cnn.forward(x), rtol=1e-6)
    cnn.save(tmp_path / "plain")  # a folder without the predictor's descriptions
    assert ModelSnapshot.load(tmp_path / "plain").inputs == snap.inputs


# ---------------------------------------------------------------------------- the worker loop, without Spark


class Tally:
    """Stands in for the predictor's Spark accumulator of the workers' statistics."""

    def __init__(self):
        self.value: dict = {}

    def add(self, update: dict) -> None:
        from optim.predict.worker import merge_stats

        merge_stats(self.value, update)


def test_worker_loop_numbers_rows_across_batches_and_nulls_bad_chunks(cnn):
    from optim.carriers import InPlan
    from optim.predict.backends import make_payload
    from optim.predict.worker import WorkerJob, predict_columns

    x = models.random_images(10, 8)
    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("img", T.ArrayType(T.FloatType()))])
    snap = ModelSnapshot.from_net(cnn)
    flat = [row.ravel().tolist() for row in x]
    flat[4], flat[5], flat[8] = None, None, flat[8][:3]
    # the feature column in Arrow batches of 5 and 5 rows, as Spark cuts a partition by its own bounds
    batches = [pa.array(flat[a:b], pa.list_(pa.float32())) for a, b in ((0, 5), (5, 10))]
    plan = plan_columns(schema, snap.inputs, snap.outputs, error_col="err")
    tally = Tally()
    job = WorkerJob("unit-" + snap.model_id, InPlan(make_payload(snap, "tensorflow")), plan, 2, "null", tally)
    parts = list(predict_columns(iter(batches), job))
    # batch_size rows at a time, across the Arrow batches' boundary (not 2, 2, 1, 2, 2, 1)
    assert [len(p) for p in parts] == [2, 2, 2, 2, 2]
    # the model's calls: the chunk of rows 4 and 5 has no good row; the one of 8 and 9 feeds row 9 alone
    assert (tally.value["calls"], tally.value["rows"]) == (4, 7), tally.value
    out = pa.Table.from_struct_array(pa.concat_arrays(parts))
    assert out.column_names == ["output", "err"] and out.num_rows == 10
    errors = out.column("err").to_pylist()
    assert [i for i, e in enumerate(errors) if e] == [4, 5, 8]  # rows 4 and 5, one from each batch, are a bad chunk
    good = [0, 1, 2, 3, 6, 7, 9]
    np.testing.assert_allclose(np.array([out.column("output")[i].as_py() for i in good]), cnn.forward(x[good]),
                               rtol=1e-5, atol=1e-6)

    strict = WorkerJob("unit-" + snap.model_id, job.payload, plan_columns(schema, snap.inputs, snap.outputs), 2, "raise")
    with pytest.raises(BadRowError, match=r"Column 'img', row 2 of partition 0: the array has 3 values"):
        list(predict_columns(iter([pa.array(flat[6:10], pa.list_(pa.float32()))]), strict))  # numbered in the partition,
    with pytest.raises(BadRowError, match=r"Column 'img', row 4 of partition 0: the value is null"):
        list(predict_columns(iter(batches), strict))  # across its Arrow batches


def test_chunks_cut_every_partition_into_full_batches_whatever_spark_s_arrow_batches():
    """Two columns in Arrow batches of random sizes (empty ones, ones shorter than a chunk, ones of many chunks):
    every chunk but the partition's last has exactly ``size`` rows, the columns stay in step, and the chunks put
    back together are the partition's rows in order."""
    from optim.predict.worker import _chunks

    rng = np.random.default_rng(0)
    for trial in range(40):
        size = int(rng.integers(1, 9))
        cuts = np.sort(rng.integers(0, 60, int(rng.integers(0, 8))))
        bounds = [0, *cuts.tolist(), 60]
        ids = pa.array(np.arange(60, dtype=np.int64))
        lists = pa.array([[float(i)] * (i % 3) for i in range(60)], pa.list_(pa.float32()))
        batches = [(ids.slice(a, b - a), lists.slice(a, b - a)) for a, b in zip(bounds, bounds[1:])]
        chunks = list(_chunks(iter(batches), size))
        assert all(len(c[0]) == size for c in chunks[:-1]) and 0 < len(chunks[-1][0]) <= size, (trial, bounds)
        assert all(len(c[0]) == len(c[1]) for c in chunks)
        joined = [pa.chunked_array([part for c in chunks for part in c[i].chunks], chunks[0][i].type) for i in (0, 1)]
        assert joined[0].to_pylist() == list(range(60)), (trial, bounds)
        assert joined[1].to_pylist() == lists.to_pylist(), (trial, bounds)
    assert list(_chunks(iter([]), 4)) == [] and list(_chunks(iter([pa.array([], pa.int64())]), 4)) == []


def test_between_tasks_the_workers_stderr_drops_only_a_reset_sockets_traceback():
    """pyspark's daemon prints the ConnectionResetError of its flush when the JVM stopped reading a tfnet task's
    output (``show(3)``: seen in a CI run); between tasks the worker's stderr drops that traceback, and only it."""
    import io
    import traceback

    from optim.predict.worker import _UnreadStderr

    def printed(error: BaseException, before: str = "") -> str:
        out = io.StringIO()
        stderr = _UnreadStderr(out)
        stderr.write(before)
        try:
            raise error
        except BaseException:
            traceback.print_exc(file=stderr)
        stderr.write("after\n")
        stderr.flush()
        return out.getvalue()

    assert printed(ConnectionResetError(104, "Connection reset by peer")) == "after\n"
    assert printed(BrokenPipeError(32, "Broken pipe"), before="a line\n") == "a line\nafter\n"
    shown = printed(ValueError("a user's own error"))
    assert shown.startswith("Traceback (most recent call last):\n") and "ValueError: a user's own error\nafter\n" in shown
    assert 'raise error' in shown  # the frames kept with it
    # pyspark/daemon.py prints its own line before the traceback of a failed flush: dropped with it (issue 56),
    # kept before any other error
    header = "PySpark daemon failed to flush the output to the worker process:\n"
    assert printed(BrokenPipeError(32, "Broken pipe"), before=header) == "after\n"
    assert printed(ValueError("other"), before=header).startswith(header + "Traceback (most recent call last):\n")
