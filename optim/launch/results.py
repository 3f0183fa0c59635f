"""What the launcher makes of a finished stage: rank 0's payload from the stage's rows, the run's step timings, and the
per-epoch lines when no progress reached this process. Driver side (or a Spark Connect client).
"""

from __future__ import annotations

from optim.errors import DistributedTrainingError
from optim.protocol import RunResult
from optim.training.reporting import ProgressBar
from optim.transport.chunks import join_chunks
from tfnet import storage

__all__ = ["print_history", "read_result", "step_times"]


def read_result(rows: list, options=None) -> bytes:
    """Rank 0's payload from the stage's rows: a file in the exchange folder (read, then removed), the
    payload itself (an RDD stage), or its pieces."""
    paths = [r for r in rows if isinstance(r, str)]
    if paths:
        data = storage.read_bytes(paths[0], options)
        storage.remove(paths[0], options)
        return data
    if rows and isinstance(rows[0], (bytes, bytearray)):
        if len(rows) != 1:
            raise DistributedTrainingError(f"Expected one result from rank 0; got {len(rows)}.")
        return bytes(rows[0])
    if not rows:
        raise DistributedTrainingError("Rank 0 returned no result.")
    return join_chunks(rows)


def step_times(sink, t_call: float) -> dict:
    """The step timings of a run's summary (:class:`~optim.protocol.RunSummary`) from the progress that reached
    this process: ``startup_s`` (from ``t_call`` to the first step), ``step_times`` and ``allreduce_seconds``."""
    steps = [e for e in sink.events if e.get("event") == "step"]
    return {"startup_s": (sink.first_step_at - t_call) if sink.first_step_at else None,
            "step_times": [e["logs"].get("step_time") for e in steps],
            "allreduce_seconds": [e["logs"].get("allreduce_seconds") for e in steps]}


def print_history(result: RunResult) -> None:
    """When no progress reached this process while the stage ran (a Connect client without
    ``model_dir``), the per-epoch lines come from the history at the end."""
    history = result.history
    epochs = max((len(v) for v in history.values()), default=0)
    per_epoch, start = result.steps_per_epoch, result.start_step or 0
    bar = ProgressBar(2)
    bar.begin(epochs, per_epoch, start, 0)
    for e in range(epochs):
        step = min(result.step, start + (e + 1) * per_epoch) if per_epoch else result.step
        bar.epoch_end(e, step, {k: v[e] for k, v in history.items() if e < len(v)})
