"""How the tests start Spark's JVMs: the suite's Spark settings (``tests/spark-conf/spark-defaults.conf``) and an
application class-data archive (AppCDS) of the classes a Spark driver loads, which the suite's JVMs map at start-up
instead of reading, parsing and linking them class by class.

A short PySpark program's driver JVM (``local[2]``: a group-by, ``createDataFrame``, ``toPandas``) took 8.1-10.1 CPU-s
without the archive and 5.8-6.1 with it, three runs of each (2-core AMD EPYC Zen 4, nothing else running;
docs/benchmarks.md, 2026-12-03). The suite starts about a hundred such JVMs.

Java 17 maps an archive only where every directory on the class path is empty, and Spark's launcher puts
``SPARK_CONF_DIR`` first on it. So the suite's settings reach PySpark's launcher as ``--properties-file`` (in
``PYSPARK_SUBMIT_ARGS``, which PySpark passes to ``spark-submit`` for every session it starts;
:mod:`tests.connect_server` passes it to its own ``spark-submit``), and ``SPARK_CONF_DIR`` stays unset (Spark's default,
``pyspark/conf``, does not exist): drivers, standalone executors and standalone daemons then have one class path. The
archive reaches every ``spark-submit`` JVM through ``SPARK_SUBMIT_OPTS``, the executors through the settings' copy
beside it, the standalone master and workers through ``SPARK_DAEMON_JAVA_OPTS``. It is made once per Java, PySpark
and dump program (its name holds their digest) under ``.pytest_cache/spark-cds/``, by :data:`DUMP`, whose JVM
writes the classes it loaded as it exits (``-XX:ArchiveClassesAtExit``, 35-50 s), beside the first tests; a JVM that
cannot map it (not there yet, another class path) runs as before, silently (``-Xlog:cds=off``). The Docker image makes
its own with the same program as it is built, and its JVMs map that one by default (docker/Dockerfile); on the host
it is the tests' own, as the JIT settings are: it changes how fast a JVM starts, not what it runs.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The suite's Spark settings (the client compiler, the serial collector, tfnet's worker daemon: the file says why).
PROPERTIES = os.path.join(ROOT, "tests", "spark-conf", "spark-defaults.conf")
#: The setting of :data:`PROPERTIES` that holds the suite's Java options (:func:`java_options`).
EXECUTOR_OPTIONS = "spark.executor.defaultJavaOptions"
#: Set with ``PYSPARK_SUBMIT_ARGS`` by :func:`configure`, to the same value: the suite's settings are in force.
IN_FORCE = "TFNET_TESTS_SPARK_SUBMIT_ARGS"
ARCHIVE_DIR = os.path.join(ROOT, ".pytest_cache", "spark-cds")
DUMP_TIMEOUT_S = 300.0
#: JVM options that map the archive where the class path allows and say nothing where it does not.
QUIET = "-Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"

#: What makes the archive: the image's program (a driver's SQL with a shuffle, a DataFrame from Python rows, Arrow both
#: ways, Parquet, a barrier stage; no TensorFlow: the classes are the JVM's), run here against the suite's Java.
DUMP = os.path.join(ROOT, "docker", "class_archive.py")


def _java_home() -> str | None:
    """The Java that Spark's launcher runs (``spark-class``: ``JAVA_HOME``, else ``java`` on the path)."""
    home = os.environ.get("JAVA_HOME")
    if home:
        return os.path.realpath(home)
    java = shutil.which("java")
    return os.path.dirname(os.path.dirname(os.path.realpath(java))) if java else None


def archive_path() -> str | None:
    """Where the archive for this Java, PySpark and :data:`DUMP` lives (it may not exist yet); None without Java."""
    import pyspark

    home = _java_home()
    if home is None:
        return None
    with open(DUMP, "rb") as f:
        digest = hashlib.sha256(f.read())
    digest.update(home.encode())
    for name in ("release", "lib/server/libjvm.so"):
        path = os.path.join(home, name)
        if os.path.exists(path):
            stat = os.stat(path)
            digest.update(f"{name} {stat.st_size} {stat.st_mtime_ns}".encode())
    jars = os.path.join(os.path.dirname(pyspark.__file__), "jars")
    for jar in sorted(glob.glob(os.path.join(jars, "*.jar"))):
        stat = os.stat(jar)
        digest.update(f"{os.path.basename(jar)} {stat.st_size} {stat.st_mtime_ns}".encode())
    return os.path.join(ARCHIVE_DIR, f"spark-{pyspark.__version__}-{digest.hexdigest()[:16]}.jsa")


def start_archive() -> str | None:
    """The archive's path; where it is not there yet, a process of its own starts making it (:func:`dump`), beside
    the first tests, whose JVMs run without it until it is there (the file appears whole, by a rename). None without
    Java. The dump's output goes to ``dump.log`` beside the archive."""
    path = archive_path()
    if path is None or os.path.exists(path):
        return path
    os.makedirs(ARCHIVE_DIR, exist_ok=True)
    lock = os.path.join(ARCHIVE_DIR, "dump.lock")
    try:  # one dump at a time: another run's, younger than a dump's longest, is left to finish
        if time.time() - os.stat(lock).st_mtime < DUMP_TIMEOUT_S:
            return path
        os.remove(lock)
    except FileNotFoundError:
        pass
    try:
        os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return path
    with open(os.path.join(ARCHIVE_DIR, "dump.log"), "wb") as log:
        subprocess.Popen([sys.executable, "-m", "tests.spark_jvm", path], cwd=ROOT, stdin=subprocess.DEVNULL,
                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return path


def dump(path: str) -> bool:
    """Makes the archive at ``path`` with :data:`DUMP` (which writes it whole, by a rename), then removes the archives of
    other Javas, PySparks or dump programs. False (the reason printed) where it could not."""
    # the JDK's own default verification (more than the suite's JVMs do), so that every JVM may map what it holds
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_CONF_DIR", "PYSPARK_SUBMIT_ARGS", "SPARK_SUBMIT_OPTS")}
    env["PYSPARK_PYTHON"] = sys.executable
    try:
        done = subprocess.run([sys.executable, DUMP, path], env=env, capture_output=True, text=True,
                              timeout=DUMP_TIMEOUT_S)
        if done.returncode != 0 or not os.path.exists(path):
            print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
            print(f"no class-data archive: the dump exited with {done.returncode}")
            return False
        for old in glob.glob(os.path.join(ARCHIVE_DIR, "spark-*.jsa")):
            if old != path:
                os.remove(old)
        print(f"made {path}")
        return True
    except subprocess.TimeoutExpired:
        print(f"no class-data archive: the dump took over {DUMP_TIMEOUT_S:.0f} s")
        return False
    finally:  # the lock, and what a dump that was killed left half-written
        for leftover in [os.path.join(ARCHIVE_DIR, "dump.lock"), *glob.glob(f"{path}.*.partial")]:
            if os.path.exists(leftover):
                os.remove(leftover)


def configure(environ: dict, archive: str | None) -> None:
    """Points the JVMs that ``environ``'s processes start at the suite's settings and at ``archive``: drivers (through
    ``SPARK_SUBMIT_OPTS``), executors (the settings' ``spark.executor.defaultJavaOptions``, in a copy of
    :data:`PROPERTIES` beside the archive) and standalone daemons (``SPARK_DAEMON_JAVA_OPTS``). Unless the developer
    set ``SPARK_CONF_DIR`` or ``PYSPARK_SUBMIT_ARGS``: then those hold, without the archive."""
    if "SPARK_CONF_DIR" in environ or "PYSPARK_SUBMIT_ARGS" in environ:
        return
    properties = PROPERTIES
    if archive:
        flags = f"-XX:SharedArchiveFile={archive} {QUIET}"
        properties = _properties_with(flags)
        for name in ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS"):
            environ[name] = " ".join(filter(None, [environ.get(name, ""), flags]))
    environ["PYSPARK_SUBMIT_ARGS"] = environ[IN_FORCE] = f"--properties-file {shlex.quote(properties)} pyspark-shell"


def java_options() -> str:
    """The suite's Java options for Spark's JVMs: :data:`PROPERTIES`' ``spark.executor.defaultJavaOptions`` (the
    standalone daemons and the Docker tier's compose cluster get the same)."""
    with open(PROPERTIES) as f:
        for line in f.read().splitlines():
            if _sets_executor_options(line):
                return line.split(None, 1)[1].strip()
    raise RuntimeError(f"{PROPERTIES} sets no {EXECUTOR_OPTIONS}")


def _sets_executor_options(line: str) -> bool:
    """Whether a line of :data:`PROPERTIES` sets :data:`EXECUTOR_OPTIONS` (key and value apart by blanks, as Spark
    reads a properties file)."""
    return line.split(None, 1)[:1] == [EXECUTOR_OPTIONS]


def _properties_with(flags: str) -> str:
    """A copy of :data:`PROPERTIES` whose executors' Java options end with ``flags``; its path."""
    lines = []
    with open(PROPERTIES) as f:
        for line in f.read().splitlines():
            if _sets_executor_options(line):
                line = f"{line} {flags}"
            lines.append(line)
    os.makedirs(ARCHIVE_DIR, exist_ok=True)
    path = os.path.join(ARCHIVE_DIR, "spark-defaults.conf")
    partial = f"{path}.{os.getpid()}"
    with open(partial, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(partial, path)
    return path


def in_force(environ: dict) -> bool:
    """Whether ``environ`` holds the suite's settings as :func:`configure` set them."""
    return IN_FORCE in environ and environ.get("PYSPARK_SUBMIT_ARGS") == environ[IN_FORCE]


def submit_args() -> list[str]:
    """``spark-submit``'s arguments for the suite's settings where they are in force, for a test that runs
    ``spark-submit`` itself."""
    return shlex.split(os.environ["PYSPARK_SUBMIT_ARGS"])[:2] if in_force(os.environ) else []


if __name__ == "__main__":
    sys.exit(0 if dump(sys.argv[1]) else 1)
