"""The seam between the one distributed path (:mod:`optim.launch.launcher`) and the two kinds of
session it runs in. Driver side (or a Spark Connect client).

The launcher makes every decision (ranks, batch split, checks, the attempts loop, retries, clean-up,
cancellation, the run summary); a backend only says how its kind of session does the few things that
differ (docs/distributed.md has the table):

=================  ==============================================  =============================================
                   classic (:mod:`.classic`)                        Spark Connect (:mod:`.connect`)
=================  ==============================================  =============================================
quiet console      task-failure loggers off, Spark's bar paused,   the bar of a server in this process paused,
                   one Python worker pool for tfnet's jobs          the client's own bar off
ranks              task slots counted (and waited for)              ``local[N]``, else ``num_workers`` needed
data (StageHost)   balanced by a row count, else as it is           repartitioned (no count: no RDDs)
shipping           broadcasts; the net through an exchange folder   in the plan; the net (and rank 0's result)
                   (local disk, shared ``model_dir``)               through ``model_dir`` when too large
rendezvous         on the driver, which watches the heartbeats      on rank 0, which watches them
progress           an authenticated channel to the driver           polled from ``model_dir`` (else the history
                                                                    at the end)
=================  ==============================================  =============================================
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from optim.carriers import Carrier
from optim.protocol import Channels, TrainSpec

__all__ = ["Attempt", "Backend"]


@dataclass
class Attempt:
    """How the ranks of one attempt meet and report: ``channels`` (:class:`optim.protocol.Channels`) and
    ``watch()`` (a reason to cancel the stage now, or None)."""

    channels: Channels = field(default_factory=Channels)
    watch: Callable[[], str | None] | None = None


class Backend:
    """One kind of session. ``spark``: the session the data came from (or the active one). A backend is the
    :class:`~optim.data.base.StageHost` the data stages itself into: it never asks which kind of data it has."""

    #: ``"classic"`` or ``"connect"``; recorded in ``last_run["mode"]``.
    mode = ""

    def __init__(self, spark):
        self.spark = spark

    def quiet(self, verbose: int, own_bar: bool = True) -> AbstractContextManager:
        """Held while tfnet's jobs run: Spark's task-failure lines stay out of the console and, when tfnet
        shows a bar of its own (``own_bar``: training), Spark's bars do too."""
        raise NotImplementedError

    def partitions(self, requested: int | None) -> int:
        """Tasks for a job over a placeholder (evaluation of ``from_tf_data``): ``requested`` or the default."""
        raise NotImplementedError

    #: Whether the session counts its task slots cheaply (a classic session asks its scheduler; a Connect
    #: client measures them with a probe job, so it does only for elastic runs).
    counts_slots = False
    #: The training stage runs without barrier mode (:mod:`optim.rank.gang`): dynamic allocation is on.
    gang = False
    #: The ranks' stderr is the user's console (a local master: the executor runs in the driver's JVM, and its
    #: Python workers write where the user's program does).
    shares_console = False

    #: Whether the driver sees decommission notices for the executors that run ranks (a classic session on a
    #: cluster with ``spark.decommission.enabled``: :mod:`optim.spark.decommission`).
    sees_decommission = False

    #: Whether :meth:`balance` gives each partition's rows in an order of their values (:func:`in_canonical_order`):
    #: set by the launcher for a run whose rank count may change inside an epoch (an elastic one).
    canonical_order = False

    def decommissioning_tasks(self) -> int:
        """The running tasks on executors being decommissioned now (0 where the session cannot tell)."""
        return 0

    def ranks(self, num_workers: int | None) -> int:
        """The number of ranks asked for: ``num_workers``, or the session's default."""
        raise NotImplementedError

    def wait_for_slots(self, n: int, wait_s: float) -> int:
        """Before a retry: waits up to ``wait_s`` seconds for ``n`` task slots; returns the slots seen."""
        raise NotImplementedError

    def slots_now(self) -> int | None:
        """The task slots the cluster has now, asked while a stage runs (None: this kind cannot tell cheaply)."""
        return None

    def free_slots(self, wanted: int, running: int) -> int:
        """Task slots free now beside a stage of ``running`` ranks (counted up to ``wanted``): whether a
        shrunk run can grow back."""
        raise NotImplementedError

    # ---- the data's StageHost (optim.data.base.StageHost)

    def placeholder(self, n: int):
        """A DataFrame of ``n`` partitions for data the ranks read themselves."""
        return self.spark.range(n, numPartitions=n)

    def balance(self, df, n: int, per_rank: int, timeout_s: float):
        """``df`` with ``n`` partitions for the stage."""
        raise NotImplementedError

    def balance_records(self, rdd, n: int, per_rank: int, timeout_s: float):
        """``rdd`` with ``n`` partitions for the stage (TypeError where the session has no RDDs)."""
        raise NotImplementedError

    def records(self, rdd):
        """``rdd`` for a job over its partitions (TypeError where the session has no RDDs)."""
        raise NotImplementedError

    def validation_limit(self) -> int:
        """The most bytes of validation arrays collected here and sent to every rank."""
        raise NotImplementedError

    def ship(self, value, cleanup) -> Carrier:
        """``value`` (numpy data, validation arrays, the net's bytes to evaluate) as the ranks get it: its carrier
        (:mod:`optim.carriers`), a broadcast or the plan."""
        raise NotImplementedError

    def ship_evaluated_net(self, net_bytes: bytes, cleanup) -> Carrier:
        """The net's bytes to evaluate as the tasks get them (:meth:`ship`; a kind with a limit on what it carries
        refuses a larger net here, with the fix)."""
        return self.ship(net_bytes, cleanup)

    def ship_net(self, spec: TrainSpec, net_bytes: bytes, carried: int, cleanup) -> tuple[Carrier, str | None]:
        """``(net, exchange)``: the net of ``spec`` (the driver's; ``net_bytes``, serialised) as the ranks get it (its
        carrier, :mod:`optim.carriers`: a file in the exchange folder, a broadcast or the plan), and the exchange
        folder rank 0's result goes through (None: the job's result rows), as ``spec.config`` and the size of rank
        0's result say. ``carried``: the bytes of numpy data and state that travel with the job."""
        raise NotImplementedError

    def progress(self, reporter, config, secret: bytes, cleanup):
        """The :class:`~optim.transport.progress.EventSink` that feeds ``reporter`` (closed by ``cleanup``)."""
        raise NotImplementedError

    def attempt(self, secret: bytes, n: int, attempt: int, sink, config,
                startup_timeout: float) -> AbstractContextManager[Attempt]:
        """The channels of one attempt, open while it runs (``sink``: what :meth:`progress` made)."""
        raise NotImplementedError

    def stage_defaults(self) -> dict:
        """Fields of :class:`~optim.launch.stage.Stage` this kind sets (the driver's address, the
        size of rank 0's result pieces)."""
        return {}

    def stopped(self) -> bool:
        """Whether the session is gone (a stopped session cannot retry)."""
        raise NotImplementedError


#: The column :func:`in_canonical_order` sorts the rows by, for the time of the sort.
ORDER_COLUMN = "__tfnet_order"


def in_canonical_order(df):
    """``df`` with each partition's rows sorted by a hash of their values (Spark's ``xxhash64``): the same order
    whichever order a shuffle before it fetched them in, so that every staging of the same rows gives each rank
    its rows in the same order. An epoch resumed on fewer ranks then finds each shard as its rank had it
    (:mod:`optim.data.virtual_shards`). Rows of equal values tie, and are alike anyway."""
    from pyspark.sql import functions as F

    keyed = df.withColumn(ORDER_COLUMN, F.xxhash64(*[F.col(c) for c in df.columns]))
    return keyed.sortWithinPartitions(ORDER_COLUMN).drop(ORDER_COLUMN)
