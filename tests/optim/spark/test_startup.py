"""The workers start importing TensorFlow as soon as tfnet creates or finds the session."""

import pytest

from optim.spark import warm_up

pytestmark = pytest.mark.spark


def test_the_session_starts_one_warm_up_per_application(spark):
    warm = warm_up.started(spark)
    assert warm is not None, "build_session started the workers' imports"
    reports = warm.wait(300)
    assert reports and all("tfnet" not in r and "tensorflow" not in r for r in reports), reports
    # finding the session again (a DataFrame wrapped for training) starts no second job
    from optim import TFDataset

    data = TFDataset.from_dataframe(spark.createDataFrame([([1.0], 0)], "x array<float>, y long"), "x", "y")
    assert data.has_labels and warm_up.started(spark) is warm
    assert warm_up.ensure_warm_up(spark) is warm


def test_dataframe_jobs_share_the_warmed_python_workers_during_tfnet_jobs():
    """Spark keeps a DataFrame job's Python workers apart from an RDD job's (SQL's runners add
    SPARK_SIMPLIFIED_TRACEBACK to their environment): warmed through an RDD job, the training stage
    of a DataFrame still waited for fresh workers. Within tfnet's jobs they share one pool, and the
    user's setting is back afterwards. A fresh Spark in a process of its own: in the suite's shared
    session, earlier tests' jobs made the pools come out either way."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "tests.optim.spark.pool_driver"], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(next(line[7:] for line in proc.stdout.splitlines() if line.startswith("RESULT ")))
    rdd = set(out["rdd"])
    assert not set(out["outside"]) & rdd, f"outside tfnet's jobs: a pool of their own {out}"
    assert out["inside_setting"] == "false"
    assert set(out["inside"]) & rdd, f"inside: the RDD job's (warmed) workers {out}"
    assert out["after_setting"] == "true" and out["after_unset"] is None, out


def test_held_settings_come_back_when_the_last_overlapping_call_ends():
    """Two of tfnet's calls on one session from two threads, ending in the other order than they began:
    the setting stays tfnet's until the last ends, then the user's is back (a plain save-and-restore
    per call left tfnet's value behind)."""
    from optim.spark.session import ARROW_BATCH_ROWS, SIMPLIFIED_TRACEBACK, shared_python_workers, small_arrow_batches

    class Conf(dict):
        def get(self, key, default=None):
            return dict.get(self, key, default)

        def set(self, key, value):
            self[key] = value

        def unset(self, key):
            self.pop(key, None)

    class Session:
        conf = Conf({SIMPLIFIED_TRACEBACK: "true"})

    s = Session()
    first, second = shared_python_workers(s), shared_python_workers(s)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert s.conf[SIMPLIFIED_TRACEBACK] == "false", "the second call still runs"
    second.__exit__(None, None, None)
    assert s.conf[SIMPLIFIED_TRACEBACK] == "true"
    with small_arrow_batches(s, 256):
        assert s.conf[ARROW_BATCH_ROWS] == "256"
        with small_arrow_batches(s, 256):
            pass
        assert s.conf[ARROW_BATCH_ROWS] == "256"
    assert ARROW_BATCH_ROWS not in s.conf
    s.conf[ARROW_BATCH_ROWS] = "100"  # a smaller setting of the user's stays
    with small_arrow_batches(s, 256):
        assert s.conf[ARROW_BATCH_ROWS] == "100"
