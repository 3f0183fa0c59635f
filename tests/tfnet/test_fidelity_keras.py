"""Keras 3 models frozen by tfnet (``from_keras``) and by TensorFlow's own converter
(``convert_variables_to_constants_v2``), loaded from a ``.pb`` with ``from_frozen_graph`` and checked
against Keras: forward to 1e-5, gradients on the input and every trainable weight to 1e-4, the
default trainable set, and one SGD step to 1e-3 (see :mod:`tests.tfnet.fidelity`)."""

import gc

import pytest

from tests.tfnet import fidelity as fd
from tests.tfnet import keras_models as km

PATHS = ("from_keras", "converter")
# More than about 20 s for both paths together on 2 cores.
SLOW = {"ResNet50", "ResNet50V2", "VGG16", "DenseNet121", "InceptionV3", "Xception", "NASNetMobile", "ConvNeXtTiny",
        "EfficientNetB0", "EfficientNetV2B0"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Freezes each model once, both ways, on first use; the cases are shared by both paths."""
    cache: dict[str, dict[str, fd.Case]] = {}
    folder = str(tmp_path_factory.mktemp("fidelity_keras"))

    def get(name: str) -> dict[str, fd.Case]:
        if name not in cache:
            cache.clear()  # one model at a time in memory
            gc.collect()
            build = km.application if name in km.APPLICATIONS else km.sequence_model
            model, x = build(name)
            cache[name] = {c.path: c for c in fd.keras_cases(name, model, x, folder)}
        return cache[name]

    return get


def _params(names):
    return [
        pytest.param(name, path, id=f"{name}-{path}", marks=[pytest.mark.slow] if name in SLOW else [])
        for name in names
        for path in PATHS
    ]


@pytest.mark.parametrize("name,path", _params(km.APPLICATIONS))
def test_keras_application_matches_keras(corpus, name, path):
    case = corpus(name)[path]
    net, errors = fd.compare(case)
    # Keras's moving means and variances are exactly what was detected (plus constant
    # Normalization statistics, which Keras does not hold as variables at all).
    missed = sorted(case.oracle.frozen - set(net.statistics))
    assert not missed, f"{case.where()} batch-norm statistics not detected: {missed[:5]}"
    assert set(net.statistics.values()) <= {"mean", "variance"}, f"{case.where()} {net.statistics}"


@pytest.mark.parametrize("name,path", _params(km.SEQUENCE_MODELS))
def test_keras_sequence_model_matches_keras(corpus, name, path):
    net, errors = fd.compare(corpus(name)[path])
    assert not net.statistic_names, f"[{name} via {path}] found statistics {net.statistics} in a model without any"
