"""Progress reporting: a progress bar, TensorBoard event files, and a combination of both.

A reporter receives ``begin``, ``step``, ``validation``, ``epoch_end``, ``checkpoint`` and ``end`` events
from the training loop (every rank's loop sends them; the distributed rank gives the progress reporters
rank 0's alone). The distributed driver uses the same progress bar, fed with the
events rank 0 sends it.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from optim.training.interrupts import stopping

_HIDDEN = ("step_time", "allreduce_seconds", "learning_rate")


def _fmt(logs: dict[str, float]) -> dict[str, str]:
    """What the bar shows: loss, metrics, samples per second (and, distributed, the allreduce share
    and the megabytes this rank sends per step)."""
    out = {}
    for k, v in logs.items():
        if k in _HIDDEN:
            continue
        if k == "bytes_per_step":  # what this rank sends to the others per step
            out["sent"] = f"{v / 1e6:.3g}MB/step"
            continue
        if isinstance(v, float):
            out[k] = f"{v:.4g}" if not math.isnan(v) else "nan"
        else:
            out[k] = str(v)
    return out


class Reporter:
    def begin(self, epochs: int, steps_per_epoch: int | None, initial_step: int, initial_epoch: int) -> None: ...
    def step(self, step: int, epoch: int, logs: dict[str, float]) -> None: ...
    def validation(self, step: int, logs: dict[str, float]) -> None: ...
    def epoch_end(self, epoch: int, step: int, logs: dict[str, float]) -> None: ...
    def checkpoint(self, step: int, epoch: int, batch: int) -> None: ...
    def end(self) -> None: ...


class MultiReporter(Reporter):
    def __init__(self, reporters):
        self.reporters = [r for r in reporters if r is not None]

    def begin(self, *a):
        for r in self.reporters:
            r.begin(*a)

    def step(self, *a):
        for r in self.reporters:
            r.step(*a)

    def validation(self, *a):
        for r in self.reporters:
            r.validation(*a)

    def epoch_end(self, *a):
        for r in self.reporters:
            r.epoch_end(*a)

    def checkpoint(self, *a):
        for r in self.reporters:
            r.checkpoint(*a)

    def end(self):
        for r in self.reporters:
            r.end()


class StepRecorder(Reporter):
    """Keeps each step's time and allreduce seconds, and when the first step ended."""

    def __init__(self):
        import time

        self._time = time.monotonic
        self.started = self._time()
        self.first_step_at = None
        self.step_times: list[float] = []
        self.allreduce_seconds: list[float | None] = []

    def step(self, step, epoch, logs):
        if self.first_step_at is None:
            self.first_step_at = self._time()
        self.step_times.append(logs.get("step_time"))
        self.allreduce_seconds.append(logs.get("allreduce_seconds"))


def check_verbose(verbose) -> int:
    """``verbose`` as Keras takes it: 0, 1, 2, or ``"auto"`` (1, as Keras's ``fit`` resolves it);
    ``True`` and ``False`` are 1 and 0.

    Raises:
        ValueError: anything else.
    """
    if verbose == "auto":
        return 1
    if isinstance(verbose, bool):  # True, False: 1, 0, as Python counts them
        return int(verbose)
    if verbose not in (0, 1, 2):
        raise ValueError(f"`verbose` must be 0 (quiet), 1 (a progress bar), 2 (one line per epoch) or 'auto'. "
                         f"Received: verbose={verbose!r}")
    return int(verbose)


def is_terminal(stream) -> bool:
    """Whether ``stream`` shows a redrawn bar as a bar: a terminal, or a notebook (where tqdm draws
    a widget), as Keras's progress bar decides."""
    try:
        return bool(stream.isatty()) or "ipykernel" in sys.modules
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return "ipykernel" in sys.modules


class ProgressBar(Reporter):
    """One tqdm bar per epoch showing loss, metrics, samples per second and the ETA.

    Args:
        verbose: 0 is quiet, 1 shows bars (in a terminal or a notebook; elsewhere, a log file or a
            pipe, one line per epoch and no redraws, as Keras does), 2 prints one line per epoch,
            ``"auto"`` is 1. Default: 1.
        file: Where the bar goes. Default: ``sys.stderr``.
    """

    def __init__(self, verbose: int | str = 1, file=None):
        self.file = file or sys.stderr
        self.verbose = check_verbose(verbose)
        if self.verbose == 1 and not is_terminal(self.file):
            self.verbose = 2
        self.bar = None
        self.epochs = 0
        self.steps_per_epoch = None

    def begin(self, epochs, steps_per_epoch, initial_step, initial_epoch):
        self.epochs = epochs
        self.steps_per_epoch = steps_per_epoch

    def _bar(self, epoch: int):
        if self.bar is None and self.verbose == 1:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.steps_per_epoch, desc=f"epoch {epoch + 1}/{self.epochs}", unit="step",
                            file=self.file, dynamic_ncols=True, leave=True)
        return self.bar

    def step(self, step, epoch, logs):
        self._speed = logs.get("samples_per_sec")
        if stopping():  # Ctrl-C: the call stops; rank 0 reports on until its task is killed
            return
        bar = self._bar(epoch)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(_fmt(logs), refresh=False)

    def validation(self, step, logs):
        # Mid-epoch validations get a line; the epoch-end one shows in the bar's final postfix.
        mid_epoch = self.bar is not None and (self.bar.total is None or self.bar.n < self.bar.total)
        if self.verbose == 1 and mid_epoch and not stopping():
            self.bar.write(f"  step {step}: " + ", ".join(f"{k}={v}" for k, v in _fmt(logs).items()), file=self.file)

    def epoch_end(self, epoch, step, logs):
        speed = getattr(self, "_speed", None)
        if speed is not None:
            logs = {**logs, "samples_per_sec": speed}
        if self.bar is not None:
            self.bar.set_postfix(_fmt(logs))
            self.bar.close()
            self.bar = None
        if self.verbose == 2 and not stopping():
            print(f"epoch {epoch + 1}/{self.epochs} (step {step}): "
                  + ", ".join(f"{k}={v}" for k, v in _fmt(logs).items()), file=self.file, flush=True)

    def end(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class TensorBoardWriter(Reporter):
    """Scalars under ``logdir/train`` (loss, metrics, learning rate, samples per second, every
    step) and ``logdir/validation``.

    ``logdir`` may be a URI (``s3://...``): TensorFlow's own writers cannot open one, so the events
    are written to a local temporary folder and uploaded at every epoch end and at the end (each
    event file whole, atomically), where TensorBoard reads them (``tensorboard --logdir s3://...``
    with the scheme's file system installed).
    """

    def __init__(self, logdir: str, storage_options=None):
        import tensorflow as tf

        from tfnet import storage

        self._tf = tf
        self.logdir = logdir
        self._options = storage_options
        self._remote = storage.is_remote(logdir)
        if self._remote:
            import tempfile

            self._local = tempfile.mkdtemp(prefix="tfnet-tensorboard-")
        else:
            self._local = logdir
            os.makedirs(logdir, exist_ok=True)
        self.train = tf.summary.create_file_writer(os.path.join(self._local, "train"))
        self.val = tf.summary.create_file_writer(os.path.join(self._local, "validation"))

    def _write(self, writer, step, logs: dict[str, Any]):
        with writer.as_default(step=step):
            for k, v in logs.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tf.summary.scalar(k, float(v))

    def _upload(self) -> None:
        if not self._remote:
            return
        from tfnet import storage

        for sub in ("train", "validation"):
            folder = os.path.join(self._local, sub)
            for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
                storage.upload_file(os.path.join(folder, name), storage.join(self.logdir, sub, name), self._options)

    def step(self, step, epoch, logs):
        self._write(self.train, step, logs)

    def validation(self, step, logs):
        self._write(self.val, step, {k[4:] if k.startswith("val_") else k: v for k, v in logs.items()})

    def epoch_end(self, epoch, step, logs):
        self._write(self.train, step, {f"epoch_{k}": v for k, v in logs.items() if not k.startswith("val_")})
        self.train.flush()
        self.val.flush()
        self._upload()

    def end(self):
        self.train.flush()
        self.val.flush()
        self.train.close()
        self.val.close()
        self._upload()
        if self._remote:
            import shutil

            shutil.rmtree(self._local, ignore_errors=True)


@dataclass
class EpochClock:
    """Timing of one epoch: its start, the last step's end, samples seen, and (rank 0, several
    ranks) the seconds spent in allreduce against the seconds spent in steps."""

    t0: float
    t_step: float
    seen: int = 0
    comm: float = 0.0
    busy: float = 0.0

    @classmethod
    def start(cls) -> EpochClock:
        now = time.perf_counter()
        return cls(now, now)

    def tick(self) -> float:
        """The seconds since the previous step ended (or the epoch started)."""
        now = time.perf_counter()
        step_time, self.t_step = now - self.t_step, now
        return step_time
