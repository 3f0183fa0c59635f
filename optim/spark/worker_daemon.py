"""Spark's Python worker daemon with TensorFlow already imported. Runs on each executor (and the driver of a
``local[n]`` session), as ``python -m optim.spark.worker_daemon``, when the session is started with::

    spark.python.daemon.module   optim.spark.worker_daemon

(:func:`optim.spark.session.build_session` sets it.) pyspark starts one daemon per executor, which forks a
Python worker for each task that finds no idle one. A worker imports TensorFlow when it first unpickles tfnet's
code, about 3 s on a 2-core machine, and Spark does not reuse a worker whose task ended before reading all of its
output (``first()``, ``take``, ``limit``, ``show``): each such action after ``TFPredictor.predict`` paid that
import again. Imported once here (``import optim`` imports it, before this module runs), it is in every worker
the daemon forks, and its pages are shared between them.

pyspark's own daemon imports its worker module only after the fork, so that no thread exists when it forks
(pandas and pyarrow start threads as they are imported). TensorFlow starts none until its runtime is first used,
which happens in the worker. The one thread pyarrow starts is the background thread of its bundled jemalloc, which
its default memory pool (mimalloc) does not use: with ``JE_ARROW_MALLOC_CONF=background_thread:false`` (unless the
environment sets it) pyarrow starts none, and this daemon also imports what a forked worker imports for tfnet's
tasks (:data:`WORKER_MODULES`, and Horovod where Keras stays unloaded): 0.7 CPU-seconds less in every worker (2-core
AMD EPYC Zen 4; docs/benchmarks.md, 2026-12-02). :func:`threads_started_here` checks that against a fresh Python
that imports numpy alone in the same environment (numpy's BLAS may start threads, which are safe to fork: OpenBLAS
stops them before a fork and starts them again after). Where the imports started any other thread, the daemon
replaces itself with pyspark's own, with one line on stderr: the workers then start as they would without this
setting. Before its first fork the daemon freezes what it holds out of the garbage collector's reach
(:func:`freeze_preloaded`), so that a worker's collections do not copy the pages the imports left shared. A worker
Python that cannot import tfnet cannot start this daemon at all; tfnet's errors name that
(:class:`~optim.errors.SparkSetupError`).
"""

from __future__ import annotations

import gc
import importlib
import os
import subprocess
import sys

__all__ = ["WORKER_MODULES", "freeze_preloaded", "keep_zip_directories", "preload", "threads_started_here", "main"]

#: What a forked worker imports for tfnet's tasks beyond ``import optim``: pyspark's worker and its Arrow
#: serializers (which import pandas and pyarrow), and tfnet's rank and predictor task code.
WORKER_MODULES = ("pyspark.worker", "pyspark.sql.pandas.serializers", "pandas", "optim.rank.task",
                  "optim.predict.worker")

_STOCK = "pyspark.daemon"
_COUNT = "import os; print(len(os.listdir('/proc/self/task')))"


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def threads_started_here() -> int | None:
    """How many more threads this process has than a fresh Python that imports numpy alone, in this environment
    (the same ``OMP_NUM_THREADS``); None where that cannot be told (no ``/proc``, the fresh Python failed)."""
    try:
        mine = _threads()
        out = subprocess.run([sys.executable, "-c", "import numpy; " + _COUNT], capture_output=True, text=True,
                             timeout=60, check=True)
        return mine - int(out.stdout.strip())
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def preload() -> None:
    """Imports :data:`WORKER_MODULES` and Horovod (where it is installed and Keras stays unloaded), pyarrow's
    jemalloc without its background thread unless the environment says otherwise. A module that cannot be imported
    here is left to the worker, whose task then names the error as it would without this daemon."""
    os.environ.setdefault("JE_ARROW_MALLOC_CONF", "background_thread:false")
    for name in WORKER_MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the worker imports it again, and its task reports what it raises
            pass
    from tfnet.quiet import eager_keras

    if not eager_keras():  # Horovod's own import would load Keras, 1.5 s and threads, in a daemon of no training
        from optim.horovod_import import import_horovod

        try:
            import_horovod()
        except Exception:  # noqa: BLE001 - no Horovod here (predicting needs none): a rank's task reports it
            pass


def keep_zip_directories() -> None:
    """A zip importer re-reads its archive's directory on ``importlib.invalidate_caches()`` only when the archive
    changed (its size or mtime), once for all the importers of one archive.

    pyspark's worker invalidates the import caches as a fresh worker's first task puts the application's files folder
    on ``sys.path``. On Python 3.11 each zip importer then re-reads its whole archive, and pyspark.zip has one importer
    per package imported from it (19 in a worker of this daemon): 0.15-0.2 CPU-s of every fresh worker (Python 3.12
    reads lazily). A changed archive is still read again, as before. Applies to this process and the workers it
    forks; idempotent."""
    import zipimport

    if sys.version_info >= (3, 12) or getattr(zipimport.zipimporter.invalidate_caches, "_tfnet", False):
        return
    original = zipimport.zipimporter.invalidate_caches
    cache = getattr(zipimport, "_zip_directory_cache", None)
    if cache is None:
        return
    read: dict[str, tuple] = {}

    def stamp(archive: str):
        try:
            st = os.stat(archive)
        except OSError:
            return None
        return st.st_size, st.st_mtime_ns

    def invalidate_caches(self) -> None:
        now = stamp(self.archive)
        seen = read.get(self.archive)
        if now is None or seen is None or seen[0] != now:
            original(self)
            if now is not None and self.archive in cache:
                read[self.archive] = (now, cache[self.archive])
            return
        self._files = seen[1]
        cache[self.archive] = seen[1]

    invalidate_caches._tfnet = True
    for archive, files in list(cache.items()):  # the archives this daemon has read, as read (moments ago)
        now = stamp(archive)
        if now is not None:
            read[archive] = (now, files)
    zipimport.zipimporter.invalidate_caches = invalidate_caches


def freeze_preloaded() -> None:
    """Collects, then moves every object this process holds into the collector's permanent generation
    (``gc.freeze()``), as Python's documentation advises before ``fork()`` without ``exec()``.

    Every forked worker otherwise shares the imports' 300,000 objects with the daemon until its first full
    collection, which walks them all and writes each one's collector header: the page of every object is copied
    into the worker. On a 2-core AMD EPYC Zen 4 one full collection in a fresh worker took 0.18 CPU-s and copied
    about 20,000 pages (80 MB); frozen, nothing, and TFPredictor's forked workers in test_console.py took 30 CPU-s
    instead of 58-62 (docs/benchmarks.md, 2026-12-04). Frozen objects are never freed in a worker: they are the
    imported modules, which live as long as it does."""
    gc.collect()
    gc.freeze()


def main() -> None:
    preload()
    keep_zip_directories()
    started = threads_started_here()
    if started is None or started > 0:
        why = ("a process's threads cannot be counted here" if started is None else
               f"importing TensorFlow and tfnet started {started} thread(s), and a process with threads must not fork")
        print(f"tfnet: optim.spark.worker_daemon runs as pyspark's own daemon: {why}", file=sys.stderr, flush=True)
        # the same process, stdin and stdout (Spark reads the daemon's port from its stdout): pyspark's daemon
        os.execv(sys.executable, [sys.executable, "-m", _STOCK, *sys.argv[1:]])
    from pyspark import daemon

    freeze_preloaded()  # last, after every import
    daemon.manager()


if __name__ == "__main__":
    main()
