"""TensorFlow's start-up banner and tfnet (issues 33 and 41). ``import tfnet`` prints none of it; a
program that imports tfnet before anything else imports TensorFlow (``import keras``) prints none of
it either: that is the documented opt-in (README, "Logging"). tfnet installs no start-up hook, so
an import of TensorFlow that comes first is left alone and prints the banner. ``TFNET_VERBOSE=1``
brings the banner back. Fresh interpreters with an environment set here (no
``TF_CPP_MIN_LOG_LEVEL``, oneDNN on), as a user's script starts."""

import os
import sys

import pytest

from tests.side_by_side import SideBySide

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BANNER = ("oneDNN custom operations", "absl::InitializeLog", "cpu_feature_guard", "To enable the following instructions")
# ``import tfnet`` leaves Keras (and scikit-learn, matplotlib) unloaded; Keras, imported after, builds a model that
# tfnet freezes to Keras's own outputs, and ``tf.keras`` is Keras 3, as in a program without tfnet.
KERAS_LATER = """
import sys
import numpy as np
import tfnet
import tensorflow as tf
print("LOADED", "keras" in sys.modules, "sklearn" in sys.modules, "matplotlib" in sys.modules)
import keras
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(3)])
x = np.random.default_rng(0).normal(size=(5, 6)).astype(np.float32)
net = tfnet.TFNet.from_keras(model)
print("DIFF", float(np.max(np.abs(net.forward(x) - model.predict(x, verbose=0)))))
print("TF.KERAS", tf.keras.layers.Dense is keras.layers.Dense, tf.keras.__version__ == keras.__version__)
"""
#: Each program, with what its environment adds.
PROGRAMS = {
    "tfnet": ("import tfnet; print('ready', tfnet.TFNet.__name__)", {}),
    "tfnet first": ("import tfnet\nimport keras\nimport tensorflow as tf\nprint('ready', keras.__name__, tf.__name__)",
                    {}),
    "keras first": ("import sys; import keras; import tfnet; print([m for m in sys.modules if 'quiet' in m])", {}),
    "verbose": ("import tfnet", {"TFNET_VERBOSE": "1"}),
    "keras later": (KERAS_LATER, {}),
    "keras eager": ("import sys, tfnet; print('keras' in sys.modules, 'sklearn' in sys.modules)",
                    {"TFNET_EAGER_KERAS": "1"}),
}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """Every program in an interpreter of its own, started side by side as the module begins."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "TFNET_VERBOSE", "PYTHONSTARTUP")}
    env.update(PYTHONPATH=ROOT, TF_ENABLE_ONEDNN_OPTS="1")
    runs = SideBySide()
    for name, (code, extra) in PROGRAMS.items():
        runs.start(name, [sys.executable, "-c", code], timeout=300, env=dict(env, **extra),
                   cwd=str(tmp_path_factory.mktemp("quiet")))
    yield runs
    runs.close()


def banner(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() if any(b in line for b in BANNER)]


def test_import_tfnet_prints_no_banner(fresh):
    proc = fresh.result("tfnet")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ready TFNet"
    assert banner(proc) == [], proc.stderr


def test_the_opt_in_import_tfnet_first_keeps_the_banner_out_of_a_keras_program(fresh):
    proc = fresh.result("tfnet first")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ready keras tensorflow"
    assert banner(proc) == [], proc.stderr


def test_tensorflow_imported_before_tfnet_is_left_alone(fresh):
    """No start-up hook: TensorFlow's own import, first, prints its banner (and the test would see it)."""
    proc = fresh.result("keras first")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['tfnet.quiet']"
    assert any("oneDNN custom operations" in line for line in banner(proc)), proc.stderr


def test_the_banner_comes_back_when_asked_for(fresh):
    proc = fresh.result("verbose")
    assert proc.returncode == 0, proc.stderr
    assert any("oneDNN custom operations" in line for line in proc.stderr.splitlines()), proc.stderr


def test_only_the_known_start_up_lines_are_dropped(capfd, monkeypatch):
    from tfnet.quiet import filtered_stderr

    monkeypatch.delenv("TFNET_VERBOSE", raising=False)

    with filtered_stderr():
        os.write(2, b"I0000 port.cc:153] oneDNN custom operations are on.\n"
                    b"I0000 cpu_feature_guard.cc:227] This TensorFlow binary is optimized\n"
                    b"kept: a real warning\n")
    assert capfd.readouterr().err.splitlines() == ["kept: a real warning"]


def test_import_tfnet_leaves_keras_unloaded_until_something_imports_it(fresh):
    """TensorFlow's own import loads all of Keras (with scikit-learn and matplotlib): 1.5 s of every Spark worker's and
    rank's start that most never use. ``import tfnet`` skips it; Keras imported after works as in any program."""
    proc = fresh.result("keras later")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line.split(" ", 1)[0].isupper())
    assert lines["LOADED"] == "False False False", proc.stdout
    assert float(lines["DIFF"]) < 1e-6, proc.stdout
    assert lines["TF.KERAS"] == "True True", proc.stdout
    assert banner(proc) == [], proc.stderr


def test_tfnet_eager_keras_gives_tensorflows_own_import(fresh):
    proc = fresh.result("keras eager")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["True", "True"], proc.stdout
