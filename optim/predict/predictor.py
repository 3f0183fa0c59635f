"""TFPredictor: batched inference with a TFNet (or a frozen graph) over Spark DataFrames and RDDs,
or locally on numpy arrays. Driver side; the code that runs in the workers is
:mod:`optim.predict.worker`.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np

from optim.carriers import InPlan
from optim.errors import CalibrationError
from optim.predict.backends import Payload, check_backend, import_openvino, make_payload
from optim.predict.columns import ColumnSpec, input_columns, plan_columns
from optim.predict.quantize import (
    calibration_arrays,
    check_precision,
    effective_precision,
    fingerprint,
    import_nncf,
    quantize_ir,
)
from optim.predict.shipping import Shipping, shipping_for
from optim.predict.snapshot import ModelSnapshot, ModelSource
from optim.predict.worker import WorkerJob, arrow_udf_body, get_engine, merge_stats, predict_rdd_partition

__all__ = ["TFPredictor"]

ON_ERROR = ("raise", "null")


class TFPredictor:
    """Runs a model over a Spark DataFrame or RDD, ``batch_per_thread`` rows per model call, with
    the model shipped once (a broadcast; in the plan under Spark Connect: :mod:`optim.predict.shipping`) and
    loaded once per Python worker; or locally on numpy.

    Args:
        net_or_path: A :class:`tfnet.TFNet` (for example the fine-tuned ``TFOptimizer.net``), an
            export folder (``TFNet.save``), a SavedModel folder, or a frozen graph (a ``.pb`` path,
            bytes or a ``GraphDef``; these need ``inputs`` and ``outputs``). The weights are
            copied when the predictor is made: later training of the net does not change it.
        batch_per_thread: Rows per model call in each worker (and locally). Default: 32.
        backend: ``"tensorflow"`` (default) or ``"openvino"`` (needs the ``openvino`` package:
            ``pip install tfnet[openvino]``). If OpenVINO cannot convert the graph, TensorFlow
            runs it, with a :class:`BackendFallbackWarning` naming the operations.
        inputs: Input tensor names, for a frozen graph file. Default: None.
        outputs: Output tensor names, for a frozen graph file. Default: None.
        on_error: ``"raise"`` (default): a bad row (a null, an array of the wrong length, an
            image that does not decode) fails the job with a :class:`BadRowError` naming the
            column, the partition and the row, raised by the action that computes the lazy
            result (``collect()``, ``write...``), as an instance of pyspark's own exception too
            (:mod:`optim.spark.typed_errors`). ``"null"``: its outputs are null and the reason goes in
            ``error_col``.
        error_col: The error column added with ``on_error="null"``. Default: ``"prediction_error"``.
        num_threads: Threads per model in each Spark worker. Default: ``spark.task.cpus`` (1
            unless set), since each concurrent task has its own Python worker. Locally: the
            library's default.
        precision: ``"fp32"`` (default); ``"bf16"``: OpenVINO's bfloat16 inference precision hint,
            or TensorFlow's oneDNN bf16 rewrite (a :class:`PrecisionWarning` and fp32 on a CPU
            without native bfloat16, or TensorFlow with oneDNN off); ``"int8"`` (``backend="openvino"`` only): NNCF post-training
            quantisation, once, here on the driver; the workers get the quantised model.
        calibration: For ``"int8"``: a sample of typical inputs, as numpy (one array, a list in
            input order or a dict by input name) or a DataFrame (sampled here on the driver).
        calibration_size: Calibration rows used. Default: 300.
        calibration_cols: For a calibration DataFrame: the column per input, as ``feature_cols``
            of :meth:`predict`. Default: the columns named like the inputs.
        validation: For ``"int8"``, NNCF's accuracy-controlled mode: ``(inputs, labels)``. Default:
            None (plain post-training quantisation).
        metric: With ``validation``: ``metric(labels, outputs) -> float``, higher is better.
        max_drop: With ``validation``: the largest metric drop allowed against fp32. Default 0.01.
        storage_options: fsspec's options for an export folder at a URI (``gs://``, ``abfs://``, ``s3://``: the
            endpoint, credentials), as ``TFNet.load`` takes them; used here on the driver only (the workers get the
            model, not the path). Default: None (the file system's own defaults: its environment variables).

    Example:
        >>> predictor = TFPredictor(net, batch_per_thread=16)            # doctest: +SKIP
        >>> scored = predictor.predict(df, feature_cols=["image"])      # doctest: +SKIP
        >>> scored.select("id", "output").show()                         # doctest: +SKIP

    Raises:
        BackendError: an unknown backend.
        BackendUnavailableError: ``backend="openvino"`` without the ``openvino`` package.
        ValueError: ``batch_per_thread`` below 1 or an unknown ``on_error``.
        PrecisionError: an unknown precision, or ``"int8"`` without ``backend="openvino"``.
        CalibrationError: ``"int8"`` calibration data that is missing, empty or of the wrong shape.
        BackendUnavailableError: ``"int8"`` without the ``nncf`` package.
    """

    def __init__(self, net_or_path: ModelSource, batch_per_thread: int = 32, backend: str = "tensorflow", *,
                 inputs: str | list[str] | None = None, outputs: str | list[str] | None = None,
                 on_error: str = "raise", error_col: str = "prediction_error", num_threads: int | None = None,
                 precision: str = "fp32", calibration: Any = None, calibration_size: int = 300,
                 calibration_cols: ColumnSpec = None, validation: tuple | None = None, metric=None,
                 max_drop: float = 0.01, storage_options: dict | None = None):
        if not _positive_int(batch_per_thread):
            raise ValueError(
                f"`batch_per_thread` must be a positive integer. Received: batch_per_thread={batch_per_thread!r}")
        if on_error not in ON_ERROR:
            raise ValueError(f"`on_error` must be one of {list(ON_ERROR)}. Received: on_error={on_error!r}")
        if num_threads is not None and not _positive_int(num_threads):
            raise ValueError(f"`num_threads` must be a positive integer or None. Received: num_threads={num_threads!r}")
        if not isinstance(error_col, str) or not error_col:
            raise ValueError(f"`error_col` must be a non-empty column name. Received: error_col={error_col!r}")
        check_backend(backend)
        check_precision(precision, backend)
        if precision != "int8" and (calibration is not None or validation is not None):
            raise CalibrationError(f"`calibration` and `validation` apply to precision='int8'. Received: "
                                   f"precision={precision!r}")
        self.batch_per_thread = batch_per_thread
        self.on_error = on_error
        self.error_col = error_col
        self.num_threads = num_threads
        self.requested_backend = backend
        self.requested_precision = precision
        self._snapshot = ModelSnapshot.from_source(net_or_path, inputs, outputs, storage_options)
        self._shipped: Shipping | None = None  # the broadcast model of a classic session, kept between calls
        self._local_stats: dict = {}
        int8 = None
        if precision == "int8":
            import_openvino()  # before any work: a missing package fails first
            import_nncf()
            arrays = calibration_arrays(calibration, self._snapshot.inputs, calibration_size, calibration_cols)

            def int8(ir):
                quantized = quantize_ir(ir, self._snapshot, arrays, validation=validation, metric=metric,
                                        max_drop=max_drop)
                self._local_stats["quantizations"] = self._local_stats.get("quantizations", 0) + 1
                return quantized, fingerprint(arrays)
        run_precision = effective_precision(precision, backend)
        self._payload = make_payload(self._snapshot, backend, num_threads, run_precision, int8)

    # ------------------------------------------------------------------ description

    @property
    def backend(self) -> str:
        """The backend that runs the model: ``"openvino"`` only if the conversion worked."""
        return self._payload.backend

    @property
    def precision(self) -> str:
        """The precision that runs: ``"int8"``, ``"bf16"`` or ``"fp32"`` (after any fallback)."""
        return self._payload.precision

    @property
    def input_names(self) -> list[str]:
        return self._snapshot.input_names

    @property
    def output_names(self) -> list[str]:
        return self._snapshot.output_names

    @property
    def snapshot(self) -> ModelSnapshot:
        """The frozen graph and input/output descriptions this predictor ships."""
        return self._snapshot

    @property
    def payload(self) -> Payload:
        """What the workers run: the backend's model and how (internal interface, for
        :mod:`optim.predict.saving`)."""
        return self._payload

    @classmethod
    def restored(cls, snapshot: ModelSnapshot, payload: Payload, settings: dict) -> TFPredictor:
        """A predictor from what :meth:`save` wrote (internal interface, for :mod:`optim.predict.saving`):
        ``settings`` holds ``requested_backend``, ``requested_precision`` and the constructor's settings."""
        predictor = cls.__new__(cls)
        for k, v in settings.items():
            setattr(predictor, k, v)
        predictor._snapshot, predictor._payload = snapshot, payload
        predictor._shipped, predictor._local_stats = None, {}
        return predictor

    def __repr__(self) -> str:
        return (f"TFPredictor(inputs={self.input_names}, outputs={self.output_names}, backend={self.backend!r}, "
                f"precision={self.precision!r}, batch_per_thread={self.batch_per_thread}, on_error={self.on_error!r})")

    # ------------------------------------------------------------------ prediction

    def predict(self, data: Any, feature_cols: ColumnSpec = None, output_cols: ColumnSpec = None):
        """Predicts on a Spark DataFrame, an RDD, a TFDataset over Spark (Parquet files, a Delta table, a DataFrame or
        an RDD), or numpy arrays. Each kind of input has its road (:mod:`optim.predict.inputs`).

        Args:
            data: A DataFrame: returns it with the output columns added (lazily, like any
                transformation); every input column is kept, and rows keep their order within
                each partition. An RDD of elements (an array for one input, a list in input
                order or a dict by input name): returns an RDD with one array (one output) or
                list of arrays per element, in order; with ``on_error="null"`` a bad element
                gives None. A TFDataset (``TFDataset.from_parquet``, ``from_delta``,
                ``from_dataframe``, ``from_rdd``), its feature columns checked against the inputs
                first: Parquet files or a Delta table (its version read) return a DataFrame of
                every column of the files (partition columns included, in the files' order), read by
                the executors of the active SparkSession (or a new one), with the output columns
                added, lazily, as for a DataFrame; a DataFrame or RDD dataset returns what its
                DataFrame or RDD would. Numpy arrays (one array, a list in input order or a dict by
                name): runs here and returns what ``TFNet.forward`` would.
            feature_cols: DataFrames only: the column for each input, as a name, a list in input
                order or a dict by input name. Array columns hold the input's per-row shape
                (flat or nested); binary columns hold encoded images (JPEG, PNG, ...), decoded
                and resized to the input's height and width in the workers; numeric columns feed
                inputs with one value per row. Default: the columns named like the inputs. A
                TFDataset names its own (its ``feature_cols``).
            output_cols: DataFrames and TFDatasets that give DataFrames: new column names, one per
                output, each an array column of the raw output. Default: ``"output"`` for one
                output, else the output names.
                Earlier versions named the one output ``"prediction"``; pass
                ``output_cols="prediction"`` to keep that name. tfnet keeps ``prediction`` for
                Spark ML's double (the class index or the value) that
                :class:`~optim.TFNetTransformer` adds with ``task=...``.

        Raises:
            ColumnError: a column that is missing or does not fit its input, an output column
                that exists already, columns given for an RDD or numpy input, or ``feature_cols``
                given with a TFDataset.
            InputSpecError, InputTypeError: numpy inputs of the wrong shape or dtype.
            DataError: Parquet files or a Delta table that cannot be read (when the dataset was made).
            TypeError: a kind of input none of these, or a TFDataset that does not predict over Spark
                (``from_ndarrays``, ``from_tf_data``: pass their arrays).
        """
        from optim.predict.inputs import road_for
        from optim.spark import typed_errors

        typed_errors.install()  # a bad row raises BadRowError from the user's own action on the result
        road = road_for(data)
        road.check_columns(data, feature_cols, output_cols)
        return road.run(self, data, feature_cols, output_cols)

    def predict_frame(self, df, feature_cols: ColumnSpec = None, output_cols: ColumnSpec = None):
        """The DataFrame road of :meth:`predict` (internal interface, for :mod:`optim.predict.inputs`)."""
        from optim.data.vectors import vectors_as_arrays

        # Spark ML Vector columns are read through hidden array columns, dropped from the result
        df, vectors = vectors_as_arrays(df, input_columns(self._snapshot.inputs, feature_cols))
        if vectors:
            feature_cols = [vectors.get(c, c) for c in input_columns(self._snapshot.inputs, feature_cols)]
        out = self._predict_arrays(df, feature_cols, output_cols)
        return out.drop(*vectors.values()) if vectors else out

    def predict_records(self, rdd):
        """The RDD road of :meth:`predict` (internal interface, for :mod:`optim.predict.inputs`)."""
        job = self._job(rdd.context, None)
        return rdd.mapPartitionsWithIndex(functools.partial(predict_rdd_partition, job=job))

    def _job(self, spark, plan) -> WorkerJob:
        """The tasks' job for ``spark`` (a session of either kind, or a SparkContext): the model shipped as that kind
        of session ships it (:func:`~optim.predict.shipping.shipping_for`); a broadcast is made on first use with a
        SparkContext, then reused."""
        shipping = shipping_for(spark, self._payload, self.num_threads, self._shipped)
        if shipping.kept:
            self._shipped = shipping
        return shipping.job(plan, self.batch_per_thread, self.on_error)

    def _predict_arrays(self, df, feature_cols, output_cols):
        """The model runs in an Arrow UDF over the feature columns alone, so the other columns stay in Spark
        (``mapInArrow`` would send every column to Python and back). Its struct result becomes the output
        columns, after the input columns."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import StructType

        plan = plan_columns(df.schema, self._snapshot.inputs, self._snapshot.outputs, feature_cols, output_cols,
                            self.error_col if self.on_error == "null" else None)
        job = self._job(df.sparkSession, plan)
        fields = plan.output_fields()
        model = F.arrow_udf(arrow_udf_body(job), StructType(fields))
        hidden = "__tfnet_outputs"
        while hidden in df.columns:
            hidden += "_"
        out = df.withColumn(hidden, model(*[_column(spec.column) for spec in plan.inputs]))
        # appended by position, so that no input column is named again (a join's twin names stay as they were)
        return out.withColumns({f.name: F.col(hidden).getField(f.name) for f in fields}).drop(hidden)

    def predict_local(self, data):
        """The numpy road of :meth:`predict` (internal interface, for :mod:`optim.predict.inputs`)."""
        from tfnet.inputs import arrange, batch_size_of, convert

        specs = self._snapshot.input_specs()
        values = arrange(data, self.input_names)
        # uint8 pixels for a float input stay uint8: the engine casts them inside its model
        tensors = [convert(v, s, t.name, narrow=True) for v, s, t in zip(values, specs, self._snapshot.inputs)]
        n = batch_size_of(tensors) or 1
        job = WorkerJob(self._payload.model_id + "-local", InPlan(self._payload), None, self.batch_per_thread, "raise")
        engine = get_engine(job, set_threads=False)
        chunks = []
        for start in range(0, n, self.batch_per_thread):
            feed = [t[start:start + self.batch_per_thread].numpy() for t in tensors]
            t0 = time.perf_counter()
            chunks.append(engine.run(feed))
            k = len(feed[0]) if feed else 0
            merge_stats(self._local_stats, {"calls": 1, "rows": k, "max_rows": k, "engine_s": time.perf_counter() - t0,
                                            "input_bytes": sum(a.nbytes for a in feed)})
        outs = [np.concatenate([c[i] for c in chunks]) for i in range(len(self.output_names))]
        return outs[0] if len(outs) == 1 else outs

    # ------------------------------------------------------------------ bookkeeping

    def stats(self) -> dict:
        """What the workers reported for this predictor's finished tasks, plus local calls:
        ``calls`` (model calls), ``rows`` (rows predicted), ``max_rows`` (largest batch),
        ``loads`` (``{"host:pid": model loads}``, one entry per Python worker that loaded it) and
        ``quantizations`` (INT8 quantisations done for this predictor, on the driver: 1 or 0), ``input_bytes``
        (the bytes of the arrays handed to the engine: a byte a value for uint8 pixels, which the engine casts),
        ``arrow_batches`` (the Arrow batches Spark sent the workers of a DataFrame: it cuts each partition by
        ``spark.sql.execution.arrow.maxRecordsPerBatch`` and ``maxBytesPerBatch``; the model's calls take
        ``batch_per_thread`` rows across them) and ``seconds``,
        summed over the processes that predicted: ``engine`` (in the model's calls), ``read`` (the workers'
        reading of Arrow columns into the model's arrays) and ``write`` (the outputs back into Arrow). What a
        Spark job took beyond their sum went to Spark: moving the rows between the JVM and Python, scheduling."""
        merged: dict = {}
        if self._shipped is not None:
            merge_stats(merged, self._shipped.stats())
        merge_stats(merged, self._local_stats)
        loads = {k.split("@", 1)[1]: v for k, v in merged.items() if k.startswith("loads@")}
        out = {k: merged.get(k, 0) for k in ("calls", "rows", "max_rows", "quantizations", "input_bytes",
                                             "arrow_batches")}
        out["loads"] = loads
        out["seconds"] = {k: merged.get(f"{k}_s", 0.0) for k in ("engine", "read", "write")}
        return out

    # ------------------------------------------------------------------ saving

    def save(self, folder) -> None:
        """Writes the model as it runs (the frozen graph, and the OpenVINO IR, INT8 quantised or
        not) and the settings to ``folder``; :meth:`load` reads it back without converting or
        quantising again."""
        from optim.predict.saving import save_predictor

        save_predictor(self, folder)

    @classmethod
    def load(cls, folder, **overrides) -> TFPredictor:
        """A predictor from a folder :meth:`save` wrote. ``overrides`` replace the saved settings
        ``batch_per_thread``, ``on_error``, ``error_col`` and ``num_threads``.

        Raises:
            FileNotFoundError: no saved predictor in ``folder``.
        """
        from optim.predict.saving import load_predictor

        return load_predictor(cls, folder, overrides)

    def close(self) -> None:
        """Removes the broadcast model from the executors. DataFrames and RDDs returned by
        :meth:`predict` cannot be computed after this."""
        if self._shipped is not None:
            self._shipped.close()
            self._shipped = None

    def __enter__(self) -> TFPredictor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _column(name: str):
    """The column named ``name`` exactly (a dot in it is part of the name, not a struct field)."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
