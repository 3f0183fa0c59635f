"""The Keras model a net came from, as text, and the Keras model back with the net's weights.

:meth:`TFNet.from_keras` keeps the model's serialized form (``keras.saving.serialize_keras_object``, JSON: the
architecture and the settings, no weights) and its variables' paths as ``net.keras_source``; :meth:`TFNet.to_keras`
rebuilds the model from it and sets every variable from the net's weight of that path (weights are named by Keras's
variable paths). A file Keras itself loads (``.keras``, ``.weights.h5``) is then Keras's own ``save`` or
``save_weights`` of that model: Keras's ``ModelCheckpoint`` writes through it. A model Keras cannot serialize (a
subclass without ``get_config``) has none.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

import numpy as np

from tfnet.errors import KerasSourceError, first_line

__all__ = ["describe", "rebuild"]

log = logging.getLogger("tfnet.keras_source")


def describe(model) -> str | None:
    """The model's serialized form and its variables' paths as JSON text, or None where Keras cannot serialize it
    (logged at DEBUG)."""
    import keras

    try:
        text = json.dumps({"model": keras.saving.serialize_keras_object(model), "weights": [v.path for v in model.weights]})
    except Exception as exc:  # noqa: BLE001 - Keras's many errors for what it cannot serialize
        log.debug("The Keras model %s cannot be serialized (%s); the net keeps no Keras source.",
                  getattr(model, "name", "?"), exc)
        return None
    return text


def rebuild(source: str, weights: Mapping[str, np.ndarray]):
    """The Keras model of ``source`` with each variable set from ``weights`` (by Keras's variable path).

    Raises:
        KerasSourceError: Keras cannot rebuild the model (a subclass not registered with
            ``keras.saving.register_keras_serializable``); a variable of the model has no weight of its name and shape.
    """
    import keras

    described = json.loads(source)
    try:
        model = keras.saving.deserialize_keras_object(described["model"])
    except (TypeError, ValueError) as exc:  # Keras's errors for a class it cannot find or a config it cannot take
        raise KerasSourceError(
            f"Keras cannot rebuild the net's model from its serialized form ({first_line(exc, 300)}). A subclassed "
            "model's class must be decorated with @keras.saving.register_keras_serializable() and imported before "
            "to_keras; net.save(folder) keeps any net.") from exc
    # a rebuilt model's variables come in the original's order, not always under its paths (a nested model's): each
    # takes the net's weight of the original's path at its position
    paths = described["weights"]
    missing = [p for p, v in zip(paths, model.weights) if p not in weights or tuple(weights[p].shape) != tuple(v.shape)]
    if missing or len(paths) != len(model.weights):
        raise KerasSourceError(f"The net's weights no longer match its Keras model: no weight of the right shape for "
                               f"{missing[:5]}{' ...' if len(missing) > 5 else ''}.")
    for path, v in zip(paths, model.weights):
        v.assign(np.asarray(weights[path]))
    return model
