"""What the launcher makes of a finished stage: the run's step timings, and the per-epoch lines when no progress
reached this process. Driver side (or a Spark Connect client). Rank 0's payload comes back through its carrier
(:func:`optim.transport.chunks.result_carrier`).
"""

from __future__ import annotations

from optim.protocol import RunResult
from optim.training.reporting import ProgressBar

__all__ = ["print_history", "step_times"]


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
