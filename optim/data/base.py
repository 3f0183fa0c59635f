"""The TFDataset protocol: what every kind of data answers, for the driver and for a rank. Both sides.

A :class:`DataAdapter` is one kind of data (numpy arrays, a ``tf.data`` input, a DataFrame, an RDD,
Parquet files, a rank's streamed rows). The code that trains, evaluates and launches never asks which
kind it holds; it asks the adapter:

* **the driver's questions**: whether it trains over Spark by default (:attr:`distributed`); its
  columns, checked against the net and the loss before any Spark job (:meth:`bind`, :meth:`checked`);
  whether the global batch is split over the ranks (:attr:`splits_batch`); how it is staged for ``n``
  ranks (:meth:`stage`: what the stage runs over, and the picklable :class:`RankData` each rank gets);
  how it goes to the ranks as validation data (:meth:`for_ranks`); how it is evaluated and predicted
  over Spark (:meth:`evaluation`, :meth:`predict_with`);
* **a rank's questions**: its batches for an epoch (:meth:`batches`, :meth:`num_batches`), and, through
  the :class:`RankData` the driver made, how its share is opened (:meth:`RankData.open`), counted and
  turned into the steps every rank agrees on.

Every road of data (numpy arrays, ``tf.data``, a DataFrame, an RDD, Parquet files, a Delta table) answers the
driver's checks, :meth:`~DataAdapter.bind` and :meth:`~DataAdapter.checked`: the base has no default for them, so
an adapter that forgets them fails at its first use, not on a rank. The other questions are capabilities
(:data:`CAPABILITIES`): an adapter either answers one or leaves the base's refusal, a ``TypeError`` naming the road
and the capability; :meth:`DataAdapter.supports` says which, without calling anything:

* numpy arrays: ``stage``, ``for_ranks``, ``hold_out`` (split on the driver);
* a ``tf.data`` input: ``stage``, ``for_ranks``, ``evaluation`` (no rows to hold out, nothing to predict over Spark);
* a DataFrame, an RDD, Parquet files and a Delta table: every capability, ``hold_out`` on the ranks (Parquet files
  and a Delta table predict as a DataFrame of their files' rows: :mod:`optim.data.parquet_frame`).

``validation_split`` (:meth:`DataAdapter.hold_out`) is the base's: each rank holds out its own rows as it reads
them (:attr:`DataAdapter.holds_out` ``"ranks"``); numpy arrays split on the driver instead, and a ``tf.data`` input
has no rows to split.

What the driver's side needs from the session it stages into is a :class:`StageHost` (the launcher's
backend): placeholders, balancing, shipping. The adapters never import the launcher. The rank's side of the data
(:class:`~optim.shares.RankData` and what it opens) lives in the core layer,
:mod:`optim.shares`, so that the driver<->rank protocol can name it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from optim.carriers import Carrier
from optim.shares import RankData

__all__ = ["CAPABILITIES", "Batch", "DataAdapter", "StageHost", "Staged"]

Batch = tuple[list, Any]


class StageHost(Protocol):
    """What an adapter asks of the session it stages into (the launcher's backend)."""

    spark: Any

    def placeholder(self, n: int):
        """A DataFrame of ``n`` empty-ish partitions (``spark.range(n, numPartitions=n)``), for data the ranks
        read themselves."""

    def balance(self, df, n: int, per_rank: int, timeout_s: float):
        """``df`` with ``n`` partitions, balanced as the session can."""

    def balance_records(self, rdd, n: int, per_rank: int, timeout_s: float):
        """``rdd`` with ``n`` partitions; raises TypeError where the session has no RDDs (Spark Connect)."""

    def records(self, rdd):
        """``rdd`` as it is, for a job over its partitions; raises TypeError where the session has no RDDs."""

    def ship(self, value, cleanup) -> Carrier:
        """``value`` as the ranks get it: its carrier (:mod:`optim.carriers`), a broadcast or the plan."""

    def validation_limit(self) -> int:
        """The most bytes of validation arrays that go to every rank."""

    def partitions(self, requested: int | None) -> int:
        """Tasks for a job over a placeholder: ``requested`` or the session's default."""


@dataclass
class Staged:
    """A dataset staged for the ranks: ``frame`` (a DataFrame) or ``records`` (an RDD) that the stage runs over,
    one partition per rank (driver only, never shipped), and ``rank_data``, which each rank gets."""

    rank_data: RankData
    frame: Any = None
    records: Any = None
    #: The tasks of a job over a placeholder (0: one per partition of ``frame`` or ``records``).
    size: int = 0

    def collect(self, task: Callable[[Iterator], Iterator[tuple]], schema, barrier: bool = True) -> list[tuple]:
        """Runs ``task`` over every partition (a barrier stage with ``barrier``) and returns what the tasks
        yielded: tuples of ``schema``'s fields (a ``pyarrow.Schema``)."""
        if self.records is not None:
            rdd = self.records.barrier() if barrier else self.records
            return [tuple(r) for r in rdd.mapPartitions(task).collect()]
        from pyspark.sql.pandas.types import from_arrow_schema

        def arrow_task(batches):
            import pyarrow as pa

            for record in task(batches):
                yield pa.RecordBatch.from_pydict({n: [v] for n, v in zip(schema.names, record)}, schema=schema)

        rows = self.frame.mapInArrow(arrow_task, from_arrow_schema(schema), barrier=barrier).collect()
        return [tuple(r) for r in rows]


#: The capabilities an adapter may have beyond the driver's checks: the method that answers each, and what it does
#: as the base's refusal names it (:meth:`DataAdapter.supports`, :meth:`DataAdapter.unsupported`).
CAPABILITIES = {
    "stage": "train over Spark",
    "for_ranks": "go to the ranks as the validation data of a distributed run",
    "evaluation": "be evaluated over Spark",
    "predict_with": "be predicted over Spark",
    "hold_out": "hold rows out for `validation_split`",
}


class DataAdapter:
    """The TFDataset protocol (see the module). Every road implements the driver's checks (:meth:`bind`,
    :meth:`checked`) and a rank's :meth:`batches` and :meth:`num_batches`, and the :data:`CAPABILITIES` it has."""

    #: What the data is, as messages name the road ("an RDD").
    road: str = "this data"
    #: Whether ``optimize`` trains on it over Spark by default (a DataFrame, an RDD, Parquet files).
    distributed: bool = False
    has_labels: bool = True
    #: The global batch ``optimize`` uses by default (None: 32).
    batch_size: int | None = None
    #: Whether the global batch is split over the ranks (a ``tf.data`` input batches itself on each rank).
    splits_batch: bool = True
    #: Rows of the Arrow batches Spark sends a rank while it reads its partition (None: Spark's default).
    arrow_batch_rows: int | None = None
    #: Where ``validation_split`` holds rows out: ``"ranks"`` (each rank its own rows, as it reads them: the base's
    #: :meth:`hold_out`), ``"driver"`` (an adapter's own :meth:`hold_out` splits them here) or None (no rows to split).
    holds_out: str | None = None
    #: The hold-out of ``validation_split`` that the ranks apply (an :class:`optim.data.holdout.HoldOut`), or None.
    holdout = None

    @classmethod
    def supports(cls, capability: str) -> bool:
        """Whether this kind of data has ``capability`` (a key of :data:`CAPABILITIES`): it answers the method of
        that name instead of the base's refusal.

        >>> DataAdapter.supports("stage")
        False
        """
        if capability not in CAPABILITIES:
            raise ValueError(f"Unknown capability {capability!r}; the capabilities are {sorted(CAPABILITIES)}.")
        if capability == "hold_out":
            return cls.holds_out is not None
        return getattr(cls, capability) is not getattr(DataAdapter, capability)

    def unsupported(self, capability: str, fix: str = "") -> TypeError:
        """The refusal of a capability this data lacks: a TypeError naming the road, its adapter and the capability
        (and ``fix``, what to do instead)."""
        return TypeError(f"{self.road} ({type(self).__name__}) cannot {CAPABILITIES.get(capability, capability)}"
                         + (f": {fix}" if fix else "") + ".")

    # ------------------------------------------------------------ the driver's questions

    def session(self):
        """The SparkSession the data belongs to, or None."""
        return None

    def spark_app(self):
        """The Spark application (a session, or an RDD's SparkContext) whose workers run this data's jobs, or None:
        what the launcher warms up as soon as a call has the data (:func:`optim.launch.preflight.warm_up_for`)."""
        return self.session()

    def bind(self, input_names: list[str], input_specs, output_names: list[str] | None = None) -> None:
        """Before any Spark job: puts the data's feature columns in the net's input order and checks them against
        the net's inputs (names, dtypes, per-row shapes) with :func:`optim.data.checks.check_feeds`; a road whose
        elements may name their labels (a ``tf.data`` input's dicts) puts them in ``output_names``' order. Every
        road implements it.

        Raises:
            InputSpecError, ColumnError: what feeds the inputs does not fit them.
        """
        raise self.unsupported("bind", "every road of data checks its features against the net on the driver")

    def checked(self, loss, net, on_nonfinite: str, where: str, training: bool = True) -> DataAdapter:
        """The data with the driver's checks of its labels and values done (or arranged for, where the rows
        are read later); raises a typed error naming the column and row. Every road implements it.

        Raises:
            DataError: labels that the loss cannot take (by their type, before any job), or bad values read here.
        """
        raise self.unsupported("checked", "every road of data checks its labels against the loss on the driver")

    def stage(self, host: StageHost, n: int, per_rank: int, *, cleanup, validation: DataAdapter | None = None,
              timeout_s: float = 600.0) -> Staged:
        """This data staged for ``n`` ranks, each taking ``per_rank`` rows a step, with ``validation`` (None,
        or an adapter whose :meth:`for_ranks` this may call) travelling with it."""
        raise self.unsupported("stage")

    def stage_resumed(self, host: StageHost, n: int, per_rank: int, shards: int, *, cleanup,
                      validation: DataAdapter | None = None, timeout_s: float = 600.0) -> Staged | None:
        """This data staged for ``n`` ranks that go on with an epoch ``shards`` ranks began, each rank holding the
        rows of the shards it takes, marked (:mod:`optim.data.virtual_shards`); None where it is staged as for a fresh
        epoch (numpy arrays, which every rank holds whole, need nothing more; other roads cut the epoch afresh)."""
        return None

    def for_ranks(self, host: StageHost, cleanup) -> Carrier:
        """This data as the validation data of a distributed run: what every rank gets."""
        raise self.unsupported("for_ranks", "give numpy arrays, or a TFDataset (from_ndarrays, from_tf_data, "
                                            "from_dataframe, from_rdd, from_parquet, from_delta)")

    def hold_out(self, holdout) -> tuple[DataAdapter, DataAdapter | None]:
        """``validation_split``: ``(training data, validation data)`` without and with the rows ``holdout`` (an
        :class:`optim.data.holdout.HoldOut`) holds out. Here, for data whose ranks read their own rows
        (:attr:`holds_out` ``"ranks"``): a copy that carries ``holdout`` to the ranks, each holding out its own rows as
        it reads them (:mod:`optim.data.holdout`), and validation data of None.

        Raises:
            ValueError: data whose rows cannot be split (a ``tf.data`` input).
        """
        if self.holds_out != "ranks":
            raise ValueError(f"`validation_split` holds out rows of numpy arrays, a DataFrame, an RDD or Parquet "
                             f"files; {type(self).__name__} has no rows to split: pass validation_data.")
        import copy

        out = copy.copy(self)
        out.holdout = holdout
        return out, None

    def carried_bytes(self) -> int:
        """The bytes that travel with the job when this is staged (numpy arrays); 0 for data the ranks read."""
        return 0

    def evaluation(self, host: StageHost, partitions: int | None) -> Staged:
        """This data staged for a distributed evaluation (a task per partition, no barrier)."""
        raise self.unsupported("evaluation")

    def predict_with(self, predictor, batch_size: int, output_cols=None):
        """The net's outputs over Spark, through ``predictor`` (a :class:`~optim.TFPredictor`); ``output_cols`` names
        the output columns where the result is a DataFrame (as ``TFPredictor.predict`` takes it; default: its
        default)."""
        raise self.unsupported("predict_with")

    def to_local(self) -> DataAdapter:
        """The data collected to this process (validation data of a distributed run)."""
        return self

    # ------------------------------------------------------------ a rank's questions

    def batches(self, batch_size: int, *, epoch: int = 0, seed: int = 0, shuffle: bool = True, skip: int = 0,
                rank: int = 0, size: int = 1, drop_remainder: bool = False, steps: int | None = None,
                training: bool = False) -> Iterator[Batch]:
        raise NotImplementedError  # pragma: no cover

    def num_batches(self, batch_size: int, *, rank: int = 0, size: int = 1, drop_remainder: bool = False) -> int | None:
        """Batches per epoch for this rank, or None when unknown in advance."""
        raise NotImplementedError  # pragma: no cover
