"""tfnet's Python worker daemon (``spark.python.daemon.module = optim.spark.worker_daemon``): pyspark's own, with
TensorFlow (and what tfnet's tasks import) imported before it forks each worker. A user's own session with pyspark's
daemon, then with tfnet's, in one process: the workers start with TensorFlow only under tfnet's, and TFPredictor's
results are the same under both. Where a thread exists before it forks, it runs as pyspark's own (a worker Python without tfnet: test_distributed)."""

import json
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.console_checks import user_env

pytestmark = [pytest.mark.spark]

# One program, two sessions one after another (a process holds one SparkContext at a time): pyspark's daemon, then
# tfnet's. Each session's first job asks fresh workers whether TensorFlow is there before any task imported it; then
# TFPredictor over a DataFrame, collected, and first() (Spark does not reuse the worker of a task whose output was
# left unread, so first() after the collect meets a fresh worker).
PROGRAM = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    from pyspark.sql import SparkSession
    from optim import TFPredictor
    from tfnet import TFNet
    from tests import digits

    MODULES = ("tensorflow", "pandas", "optim.rank.task", "optim.predict.worker", "horovod.tensorflow", "keras")

    def fresh_worker(_):  # what a fresh worker holds before any task imported anything; pages a collection copies
        import gc, resource
        held = {m: m in sys.modules for m in MODULES}
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        gc.collect()
        copied = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        return held, os.getpid(), gc.get_freeze_count(), copied

    net = TFNet.from_keras(digits.cnn(classes=10, seed=0))
    x = np.random.default_rng(0).random((40, 8, 8, 1), dtype=np.float32)
    for daemon in ("pyspark.daemon", "optim.spark.worker_daemon"):
        spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                 .config("spark.python.daemon.module", daemon).getOrCreate())
        workers = spark.sparkContext.parallelize(range(2), 2).map(fresh_worker).collect()
        df = spark.createDataFrame([(image.ravel().tolist(), i) for i, image in enumerate(x)],
                                   "pixels array<float>, id long").repartition(2)
        predicted = TFPredictor(net, batch_per_thread=16).predict(df, feature_cols="pixels")
        rows = sorted(predicted.collect(), key=lambda row: row.id)
        first = predicted.first()
        print("RESULT", json.dumps({"daemon": daemon, "workers": workers, "ids": [row.id for row in rows],
                                    "outputs": [list(row.output) for row in rows],
                                    "first": [first.id, list(first.output)]}), flush=True)
        spark.stop()
""")


def test_workers_start_with_tensorflow_under_tfnets_daemon_and_predict_the_same(tmp_path):
    from tests import digits
    from tfnet import TFNet

    proc = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=300, env=user_env(),
                          cwd=tmp_path)
    results = {r["daemon"]: r for r in (json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines()
                                         if line.startswith("RESULT "))}
    assert proc.returncode == 0 and len(results) == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    stock, tfnets = results["pyspark.daemon"], results["optim.spark.worker_daemon"]
    # before any task imported them: under pyspark's daemon the workers import everything themselves; under tfnet's
    # they hold TensorFlow, pandas, tfnet's task code and Horovod (without the Keras its own import loads)
    nothing = {"tensorflow": False, "pandas": False, "optim.rank.task": False, "optim.predict.worker": False,
               "horovod.tensorflow": False, "keras": False}
    assert [preloaded for preloaded, *_ in stock["workers"]] == [nothing, nothing]
    held = dict(nothing, tensorflow=True, pandas=True, **{"optim.rank.task": True, "optim.predict.worker": True,
                                                          "horovod.tensorflow": True})
    assert [preloaded for preloaded, *_ in tfnets["workers"]] == [held, held]
    # tfnet's daemon froze what it imported before it forked (gc.freeze): a worker's full collection leaves those
    # objects' pages shared (without the freeze it walked 300,000 objects and copied about 20,000 pages, 80 MB)
    assert [frozen for _, _, frozen, _ in stock["workers"]] == [0, 0]
    assert all(frozen > 100_000 and copied < 1_000 for _, _, frozen, copied in tfnets["workers"]), tfnets["workers"]
    x = np.random.default_rng(0).random((40, 8, 8, 1), dtype=np.float32)
    expected = TFNet.from_keras(digits.cnn(classes=10, seed=0)).forward(x)
    for result in (stock, tfnets):
        assert result["ids"] == list(range(40))
        # batches of 16 against one forward of 40: oneDNN may sum in another order (a few float32 roundings)
        np.testing.assert_allclose(np.array(result["outputs"], np.float32), expected, rtol=1e-5, atol=1e-6)
        first_id, first_output = result["first"]
        np.testing.assert_allclose(np.array(first_output, np.float32), expected[first_id], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.array(stock["outputs"]), np.array(tfnets["outputs"]))  # the same arithmetic


def test_the_daemon_runs_as_pysparks_own_where_a_thread_exists_before_it_forks(tmp_path):
    """The daemon's entry point in a Python where one more thread runs than numpy alone starts (as an import that
    starts a thread would leave it): it says why on one stderr line and becomes pyspark's own daemon (the same
    process), which answers as Spark expects, with its port on stdout, and stops when its stdin closes."""
    code = ("import sys, threading, time; threading.Thread(target=time.sleep, args=(120,), daemon=True).start(); "
            "from optim.spark.worker_daemon import main; main()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=user_env(), cwd=tmp_path)
    try:
        port = struct.unpack("!i", proc.stdout.read(4))[0]  # pyspark's daemon: write_int(port) to stdout
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            cmdline = f.read().split(b"\0")
        assert 0 < port < 65536 and cmdline[1:3] == [b"-m", b"pyspark.daemon"], (port, cmdline)
    finally:
        proc.stdin.close()  # the daemon's stdin closing is Spark's way of stopping it
        proc.wait(timeout=60)
    assert proc.stderr.read().decode().splitlines() == [
        "tfnet: optim.spark.worker_daemon runs as pyspark's own daemon: importing TensorFlow and tfnet started 1 "
        "thread(s), and a process with threads must not fork"]


def test_importing_the_daemon_starts_no_thread_beyond_numpys():
    """In a fresh Python, as Spark starts the daemon: ``import optim`` (TensorFlow and tfnet) leaves the threads
    numpy alone starts, with Spark's one OpenMP thread per task and with more (this CPU, this TensorFlow)."""
    for omp in ("1", "4"):
        code = "from optim.spark.worker_daemon import threads_started_here; print(threads_started_here())"
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                              env=user_env(OMP_NUM_THREADS=omp))
        assert proc.stdout.strip() == "0", (omp, proc.stdout + proc.stderr[-2000:])


ZIP_IMPORTS = textwrap.dedent("""
    import importlib, json, sys, time, zipfile, zipimport
    from optim.spark.worker_daemon import keep_zip_directories

    archive = sys.argv[1]
    def write(modules):
        with zipfile.ZipFile(archive, "w") as z:
            for name, source in modules.items():
                z.writestr(name, source)
    write({"pkg/__init__.py": "", "pkg/a.py": "A = 1", "pkg/sub/__init__.py": ""})
    sys.path.insert(0, archive)
    import pkg.a, pkg.sub  # importers of one archive: the path entry's and pkg's
    reads = []
    original = zipimport._read_directory
    zipimport._read_directory = lambda path: reads.append(path) or original(path)
    counts = []
    importlib.invalidate_caches(); counts.append(len(reads))  # as pyspark's worker does: each importer reads
    keep_zip_directories()
    keep_zip_directories()
    importlib.invalidate_caches(); counts.append(len(reads))  # unchanged: none
    time.sleep(0.01)
    write({"pkg/__init__.py": "", "pkg/a.py": "A = 1", "pkg/sub/__init__.py": "", "pkg/b.py": "B = 2"})
    importlib.invalidate_caches(); counts.append(len(reads))  # changed: read once, for all
    import pkg.b
    print(json.dumps({"reads": counts, "B": pkg.b.B}))
""")


def test_a_workers_import_cache_invalidation_rereads_only_a_changed_zip(tmp_path):
    """pyspark's worker calls ``importlib.invalidate_caches()`` as a fresh worker's first task changes ``sys.path``;
    on Python 3.11 every zip importer re-read its whole archive (19 of pyspark.zip: 0.15-0.2 CPU-s a worker). Under
    :func:`~optim.spark.worker_daemon.keep_zip_directories` an unchanged archive is not read, a changed one once."""
    proc = subprocess.run([sys.executable, "-c", ZIP_IMPORTS, str(tmp_path / "modules.zip")], capture_output=True,
                          text=True, timeout=120, env=user_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    before, unchanged, changed = out["reads"]
    assert before >= 2 and unchanged == before and changed == before + 1 and out["B"] == 2, out
