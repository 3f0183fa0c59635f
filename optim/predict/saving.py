"""Saving a TFPredictor as it runs: the frozen graph (export layout), the OpenVINO IR (INT8
quantised, when it is) and the settings, so that loading it neither converts nor quantises again.

Layout of the folder::

    frozen_inference_graph.pb, graph_meta.json   the snapshot (TFNet.load reads it too)
    openvino/model.xml, openvino/model.bin       the IR the workers run (OpenVINO backend only)
    predictor.json                               backend, precision, model id and settings
"""

from __future__ import annotations

import json
import os

from optim.predict.backends import Payload
from optim.predict.snapshot import ModelSnapshot
from tfnet.atomic import write_bytes_atomic, write_json_atomic

__all__ = ["save_predictor", "load_predictor"]

SETTINGS_FILE = "predictor.json"
_IR_DIR = "openvino"
_SETTINGS = ("batch_per_thread", "on_error", "error_col", "num_threads")


def save_predictor(predictor, folder) -> None:
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    predictor.snapshot.save(folder)
    payload = predictor.payload
    if payload.backend == "openvino":
        os.makedirs(os.path.join(folder, _IR_DIR), exist_ok=True)
        xml, weights = payload.model
        write_bytes_atomic(os.path.join(folder, _IR_DIR, "model.bin"), weights)
        write_bytes_atomic(os.path.join(folder, _IR_DIR, "model.xml"), xml)
    write_json_atomic(os.path.join(folder, SETTINGS_FILE), {
        "backend": payload.backend, "precision": payload.precision, "model_id": payload.model_id,
        "requested_backend": predictor.requested_backend, "requested_precision": predictor.requested_precision,
        **{k: getattr(predictor, k) for k in _SETTINGS},
    })


def load_predictor(cls, folder, overrides: dict):
    from optim.predict.quantize import effective_precision

    folder = os.fspath(folder)
    path = os.path.join(folder, SETTINGS_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"No saved TFPredictor in {folder!r} (no {SETTINGS_FILE}); write one with "
                                "TFPredictor.save(folder).")
    unknown = sorted(set(overrides) - set(_SETTINGS))
    if unknown:
        raise TypeError(f"TFPredictor.load takes overrides for {list(_SETTINGS)}. Received: {unknown}")
    with open(path) as f:
        settings = json.load(f)
    settings.update(overrides)
    snapshot = ModelSnapshot.load(folder)
    if settings["backend"] == "openvino":
        from optim.predict.backends import import_openvino

        import_openvino()
        with open(os.path.join(folder, _IR_DIR, "model.xml"), "rb") as f:
            xml = f.read()
        with open(os.path.join(folder, _IR_DIR, "model.bin"), "rb") as f:
            weights = f.read()
        model = (xml, weights)
    else:
        model = snapshot.graph
    precision = settings["precision"]
    if precision == "bf16":
        precision = effective_precision(precision, settings["backend"])
    payload = Payload(settings["model_id"], settings["backend"], snapshot.inputs, snapshot.outputs, model,
                      settings["num_threads"], precision)
    kept = {"requested_backend": settings.get("requested_backend", settings["backend"]),
            "requested_precision": settings.get("requested_precision", precision),
            **{k: settings[k] for k in _SETTINGS}}
    return cls.restored(snapshot, payload, kept)
