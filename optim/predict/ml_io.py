"""Saving and loading a Spark ML stage that carries a model: the params as Spark ML's metadata JSON,
the model in a folder beside it (``TFNetTransformer``, ``TFNetEstimator``). Driver side."""

from __future__ import annotations

import os
from collections.abc import Callable
from urllib.parse import urlparse

from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReader, MLWriter

__all__ = ["ModelFolderReader", "ModelFolderWriter", "local_path"]


def local_path(path: str, what: str = "This stage") -> str:
    """``path`` as a local path (a ``file://`` URI or a plain path); other schemes are refused,
    naming ``what`` saves there."""
    parsed = urlparse(path)
    if parsed.scheme in ("", "file"):
        return parsed.path if parsed.scheme else path
    raise ValueError(
        f"{what} saves its model with local file I/O; {path!r} is on {parsed.scheme!r}. Save to a local (or "
        "mounted) path, then copy the folder."
    )


class ModelFolderWriter(MLWriter):
    """Writes ``instance``'s params, then ``save_model(path/folder)`` (None: no model to write)."""

    def __init__(self, instance, folder: str, save_model: Callable[[str], None] | None):
        super().__init__()
        self.instance, self.folder, self.save_model = instance, folder, save_model

    def saveImpl(self, path: str) -> None:  # noqa: N802 (Spark's name)
        folder = os.path.join(local_path(path, type(self.instance).__name__), self.folder)  # refused before writing
        DefaultParamsWriter.saveMetadata(self.instance, path, self.sparkSession, extraMetadata={"modelFolder": self.folder})
        if self.save_model is not None:
            self.save_model(folder)


class ModelFolderReader(MLReader):
    """Makes ``cls()``, sets its uid and params from the metadata, then ``load_model(instance, folder)``
    and ``upgrade(instance, metadata)`` (params saved by an earlier version, brought up to date)."""

    def __init__(self, cls, folder: str, load_model: Callable[[object, str], None],
                 upgrade: Callable[[object, dict], None] | None = None):
        super().__init__()
        self.cls, self.folder, self.load_model, self.upgrade = cls, folder, load_model, upgrade

    def load(self, path: str):
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        instance = self.cls()
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        folder = os.path.join(local_path(path, self.cls.__name__), metadata.get("modelFolder", self.folder))
        self.load_model(instance, folder)
        if self.upgrade is not None:
            self.upgrade(instance, metadata)
        return instance
