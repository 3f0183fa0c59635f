"""Data augmentation on the ranks: functions of a batch of features, applied to training batches
only (never to validation or evaluation), with a generator seeded by ``[seed, epoch, rank, batch]``,
so a seeded run is repeatable and a resumed one sees the same augmented batches. Pure numpy."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["RandomCropFlip"]


@dataclass(frozen=True)
class RandomCropFlip:
    """Pads each image by ``padding`` pixels (edge values), takes a random crop of the original size,
    and flips it left to right with probability ``flip`` (the CIFAR recipe). Applies to the inputs
    ``inputs`` (default: the first), each a batch ``[n, height, width, channels]``.

    >>> aug = RandomCropFlip(padding=2, flip=0.5)
    >>> out = aug([np.zeros((4, 8, 8, 3), np.float32)], np.random.default_rng(0))
    >>> out[0].shape
    (4, 8, 8, 3)
    """

    padding: int = 4
    flip: float = 0.5
    inputs: tuple[int, ...] = (0,)

    def __post_init__(self):
        if not isinstance(self.padding, int) or self.padding < 0:
            raise ValueError(f"`padding` must be a non-negative integer. Received: padding={self.padding!r}")
        if not 0.0 <= float(self.flip) <= 1.0:
            raise ValueError(f"`flip` must be a probability in [0, 1]. Received: flip={self.flip!r}")

    def __call__(self, features: list[np.ndarray], rng: np.random.Generator) -> list[np.ndarray]:
        out = list(features)
        for i in self.inputs:
            out[i] = self._images(np.asarray(features[i]), rng)
        return out

    def _images(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if x.ndim != 4:
            raise ValueError(f"RandomCropFlip takes images [batch, height, width, channels]; received shape {x.shape}.")
        n, h, w, _ = x.shape
        p = self.padding
        padded = np.pad(x, ((0, 0), (p, p), (p, p), (0, 0)), mode="edge") if p else x
        dy, dx = rng.integers(0, 2 * p + 1, n), rng.integers(0, 2 * p + 1, n)
        flips = rng.random(n) < self.flip
        out = np.empty_like(x)
        for k in range(n):
            crop = padded[k, dy[k]:dy[k] + h, dx[k]:dx[k] + w]
            out[k] = crop[:, ::-1] if flips[k] else crop
        return out
