"""Thread settings (in fresh processes: TensorFlow fixes its pools on first use) and docstrings."""

import doctest
import subprocess
import sys
import textwrap

import pytest

import tfnet


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )


def test_set_num_threads_before_tensorflow_starts():
    proc = run_python(
        """
        import numpy as np, tensorflow as tf, tfnet
        tfnet.set_num_threads(intra_op=1, inter_op=2)
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
            tf.matmul(x, tf.constant([[1.0], [1.0]], name="w"), name="y")
        net = tfnet.TFNet.from_frozen_graph(g.as_graph_def(), "x", "y")
        assert net.forward(np.ones((1, 2))).tolist() == [[2.0]]
        print(tfnet.get_num_threads())
        tfnet.set_num_threads(intra_op=1)  # same value again: fine
        try:
            tfnet.set_num_threads(intra_op=2)
        except RuntimeError as e:
            print("ERR", e)
        """
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "(1, 2)" in proc.stdout
    assert "ERR TensorFlow's thread pools are already running, so intra_op cannot change to 2" in proc.stdout


def test_set_num_threads_rejects_bad_counts():
    with pytest.raises(ValueError, match=r"`intra_op` must be a positive integer. Received: intra_op=0"):
        tfnet.set_num_threads(intra_op=0)


@pytest.mark.parametrize("module", ["tfnet.net", "tfnet.net_surgery", "tfnet.graph_utils", "tfnet.errors"])
def test_docstring_examples_run(module):
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0
