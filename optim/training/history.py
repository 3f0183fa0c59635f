"""What ``TFOptimizer.optimize`` returns: a Keras-style ``History`` that is also the plain dict it
always was. Any process."""

from __future__ import annotations

__all__ = ["History"]


class History(dict):
    """The per-epoch lists of a run (``loss``, each metric, their ``val_`` versions), read as Keras's
    ``History`` is (``history.history["loss"]``, ``history.epoch``) or as a dict (``history["loss"]``,
    ``"val_loss" in history``, ``history.keys()``, iteration, ``json.dumps(history)``).

    Attributes:
        history: The per-epoch lists by name (this object itself: a dict).
        epoch: The index of each epoch the lists hold, from 0 (a resumed run's lists start at its
            first epoch, so its earlier epochs are there too).
        params: What the call was given: ``epochs``, ``verbose`` and, when known, ``steps`` (per epoch).

    Example:
        >>> h = History({"loss": [0.9, 0.5]}, params={"epochs": 2})
        >>> h.history["loss"], h["loss"][-1], h.epoch
        ([0.9, 0.5], 0.5, [0, 1])
    """

    def __init__(self, logs: dict | None = None, params: dict | None = None):
        super().__init__(logs or {})
        runs = [len(v) for k, v in self.items() if not k.startswith("val_") and k != "skipped_steps"]
        self.epoch: list[int] = list(range(max(runs, default=0)))
        self.params: dict = dict(params or {})

    @property
    def history(self) -> dict:
        """The per-epoch lists by name, as Keras's ``History.history`` (this object itself)."""
        return self
