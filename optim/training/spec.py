"""Training from a :class:`~optim.protocol.TrainSpec`: what a local run and every rank of a distributed one call,
so that neither unpacks the spec into the arguments of the loop's own :func:`optim.training.loop.train`."""

from __future__ import annotations

from collections.abc import Callable

from optim.data.base import DataAdapter
from optim.protocol import RunResult, TrainSpec
from optim.training import loop
from optim.training.collective import Collective
from optim.training.liveness import Liveness
from optim.training.reporting import Reporter

__all__ = ["train"]


def train(net, spec: TrainSpec, data: DataAdapter, *, collective: Collective | None = None,
          reporter: Reporter | None = None, validation_data: DataAdapter | None = None,
          steps_per_epoch: int | None = None, liveness: Liveness | None = None,
          stop_check: Callable[[], bool] | None = None, notice_check: Callable[[], bool] | None = None,
          notice_every_s: float | None = None) -> RunResult:
    """Trains ``net`` (built: ``spec.net`` may be its shipped form) on ``data`` as ``spec`` says: its loss, method,
    metrics and config, the optimiser and server states and the step to go on from, and what gives the logged
    learning rate. The other arguments are :func:`optim.training.loop.train`'s."""
    return loop.train(net, spec.loss, spec.method, spec.metrics, data, spec.config, collective=collective,
                      reporter=reporter, validation_data=validation_data, steps_per_epoch=steps_per_epoch,
                      initial_state=spec.state, start_step=spec.start_step, lr_source=spec.lr_source, liveness=liveness,
                      initial_exchange_state=spec.exchange_state, stop_check=stop_check, notice_check=notice_check,
                      notice_every_s=notice_every_s)
