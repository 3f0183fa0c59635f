"""Shared test set-up. Tiers, selected with -m:

* unit: no Spark (TensorFlow only);
* spark: a real Spark (local[2], or a standalone master and workers);
* parallel: real Horovod ranks over Gloo;
* docker: the cluster image and a compose cluster on a real Docker engine (tests/docker/; set up by
  scripts/docker_env.sh, never skipped in CI).

``make test`` runs two pytest workers (pytest-xdist) in three lanes (:func:`pytest_xdist_make_scheduler`): the first
worker runs every module but pytest.ini's ``one_core_modules`` and ``beside_modules``, one test after another in
collection order, as one process would; the second runs the ``one_core_modules``, in-process TensorFlow modules that
keep one core busy, with TensorFlow at one thread, beside the first, and then the ``beside_modules``, Spark modules
that use nothing the whole machine shares (their own ``local[2]`` or Connect server), still at one thread.
``make test TEST_WORKERS=0`` runs one process.
"""

import os
import signal

# Ctrl-C as a terminal delivers it. A suite started in the background of a non-interactive shell (`make test &`, a
# runner's subshell) inherits SIGINT ignored; Python then leaves it ignored, and so does every program the tests start,
# so the Ctrl-C tests saw no KeyboardInterrupt at all. With a handler here, each child starts with SIGINT at its
# default and installs Python's own handler, as an interpreter started from a terminal has.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# gcsfs 2026.3 and later ask the Storage Control API (gRPC over TLS) what kind each bucket is, before every
# operation, and retry for 60 s where it is not there: the GCS emulator of the tests (tests/gcs_server.py) has no
# such API. gcsfs reads this at import, so it is set before anything imports it; Spark's Python workers,
# started later, inherit it.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
# Every JVM the tests start (drivers, executors, Connect servers; the standalone master and workers) compiles with
# the client compiler only, collects with the serial collector and verifies no jar's bytecode:
# tests/spark-conf/spark-defaults.conf says why. Not pytest's own (_own_jvm_keeps_c2). They map a class-data archive
# of Spark's classes, made once, beside the first tests (tests/spark_jvm.py says how and why).
from tests import spark_jvm  # noqa: E402

os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", spark_jvm.java_options())

spark_jvm.configure(os.environ, None if os.environ.get("PYTEST_XDIST_WORKER") else spark_jvm.start_archive())
#: The pytest-xdist worker of the one-core lane (pytest.ini's one_core_modules): TensorFlow's thread pools there have one
#: thread, read from the environment as TensorFlow starts (its own variables), so that the lane keeps one core busy
#: and the first worker's Spark, JVMs and ranks have the other. xdist names its workers before this file is imported.
ONE_CORE_WORKER = "gw1"
ONE_CORE_ENV = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}
if os.environ.get("PYTEST_XDIST_WORKER") == ONE_CORE_WORKER:
    os.environ.update(ONE_CORE_ENV)


def lane_cores() -> int:
    """The cores a test may keep busy: one in the one-core lane (the first worker's tests have the other), else the
    machine's. For a test that shares its work among processes of its own."""
    return 1 if os.environ.get("PYTEST_XDIST_WORKER") == ONE_CORE_WORKER else (os.cpu_count() or 1)


def environ_without_the_lane() -> dict[str, str]:
    """``os.environ`` without the one-core lane's settings: for a child that must run as users run it."""
    return {k: v for k, v in os.environ.items() if k not in (*ONE_CORE_ENV, "PYTEST_XDIST_WORKER")}

import json  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402

#: The standalone cluster that test_cluster.py and test_elastic.py share (its ``cluster`` fixture).
pytest_plugins = ["tests.cluster_fixture", "tests.bf16_kernels"]


def _own_jvm_keeps_c2() -> None:
    """The JVM of pytest's own process (every in-process SparkSession's, whichever test starts it) lives the whole
    run and does most of the in-process Spark work: it keeps both compilers, as before tests/spark-conf, whose
    client compiler alone is meant for the short-lived JVMs. In the one clean clone with it everywhere, the
    in-process Spark modules took 1.6-2x as long as in the clone before, while a short run of two of them alone
    showed no difference either way (docs/benchmarks.md): until a clean clone says which, this JVM stays as it
    was. pyspark builds the JVM's environment from ``os.environ`` when it launches it, once per process."""
    import pyspark.core.context as context

    launch = context.launch_gateway

    def launch_gateway(*args, **kwargs):
        if not spark_jvm.in_force(os.environ):  # the developer's own settings
            return launch(*args, **kwargs)
        own = os.environ.pop("PYSPARK_SUBMIT_ARGS")
        try:
            return launch(*args, **kwargs)
        finally:
            os.environ["PYSPARK_SUBMIT_ARGS"] = own

    context.launch_gateway = launch_gateway


_own_jvm_keeps_c2()

#: The only skips allowed under CI=true: tests of a hardware feature this CPU lacks. Any other skip fails there.
HARDWARE_SKIPS = re.compile(r"no native bfloat16|\bAMX\b")
#: Every test phase's duration in the last run, slowest first (compare two runs to see what a change cost):
#: ``[node id, phase, wall seconds, the machine's busy CPU-seconds meanwhile]``.
DURATIONS_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".pytest_cache",
                              "durations.json")


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = str(longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else longrepr)
    return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason


def _refuse_skip_in_ci(report) -> None:
    """Under CI=true a skip whose reason is not a hardware feature (HARDWARE_SKIPS) becomes a failure."""
    if not (in_ci() and report.skipped and not hasattr(report, "wasxfail")):
        return
    reason = _skip_reason(report)
    if HARDWARE_SKIPS.search(reason):
        return
    report.outcome = "failed"
    report.longrepr = (f"skipped under CI=true: {reason}\nOnly a missing hardware feature may skip in CI "
                       "(tests/conftest.py, HARDWARE_SKIPS): install what the test needs (scripts/install.sh).")


def _machine_busy_s() -> float:
    """Seconds of CPU the whole machine has spent busy since boot (``/proc/stat``: all but idle and iowait, over
    every core and process, the JVMs, Spark's workers and containers included)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


_BUSY = pytest.StashKey[dict]()


def _measured(item, when: str):
    """A phase hook's wrapper body: the machine's busy CPU-seconds during ``when``, kept in the item's stash."""
    start = _machine_busy_s()
    yield
    item.stash.setdefault(_BUSY, {})[when] = _machine_busy_s() - start


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _measured(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _measured(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield from _measured(item, "teardown")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    # the machine's busy CPU-seconds during the phase, beside its wall time in DURATIONS_FILE: a slow test whose
    # machine sat idle waits on something (a timeout, a poll, a heartbeat), not on work
    report.machine_cpu_s = item.stash.get(_BUSY, {}).get(call.when)
    _refuse_skip_in_ci(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _refuse_skip_in_ci(outcome.get_result())


_SESSION = pytest.StashKey[tuple]()


def pytest_sessionstart(session):
    session.config.stash[_SESSION] = (time.monotonic(), _machine_busy_s())


def pytest_collection_finish(session):
    """What collection imported (TensorFlow, Keras, Spark, the test modules: about 300,000-430,000 objects) goes into
    the collector's permanent generation (``gc.freeze()``), so that each full collection during the tests walks only
    what the tests made since. In one process of test_onnx_models.py and test_net_models.py at one thread (2-core AMD
    EPYC Zen 4) full collections took 3.9 CPU-s of 43.8 before, 2.3 of 40.7 after (docs/benchmarks.md, 2026-12-04).
    Nothing collected here is freed later: modules, test functions and their parameters live as long as the run."""
    import gc

    gc.collect()
    gc.freeze()


@pytest.fixture
def summary_line(request):
    """``summary_line(text)`` adds a line to the end of the run's output (what an outside suite passed, say), where
    pytest-xdist's controller writes it too: a worker's own prints are not shown."""
    return lambda text: request.node.user_properties.append(("summary", text))


def pytest_terminal_summary(terminalreporter, config):
    """The tests' summary lines, one line for the hardware skips with the CPU that caused them, the machine's load;
    every duration to DURATIONS_FILE. Only where the run's summary is written (not in a pytest-xdist worker)."""
    if hasattr(config, "workerinput"):
        return
    reports = [r for key in ("passed", "failed", "error", "") for r in terminalreporter.stats.get(key, [])]
    for report in (r for r in reports if r.when == "call"):  # (every phase's report carries the test's properties)
        for name, text in getattr(report, "user_properties", ()):
            if name == "summary":
                terminalreporter.write_line(text)
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if HARDWARE_SKIPS.search(_skip_reason(r))]
    if skipped:
        from tfnet.precision import cpu_flags, cpu_model  # imports TensorFlow (3 s): only where the line is written

        flags = sorted(cpu_flags() & {"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8"})
        terminalreporter.write_line(f"hardware skips: {len(skipped)} test(s) need a feature this CPU lacks "
                                    f"({cpu_model()}; flags {' '.join(flags) or 'none of note'})")
    # (a set-up or teardown that passed is filed under "": the module fixtures' clusters and image builds). The
    # busy CPU-seconds are the whole machine's, so in two lanes a phase's count includes the other lane's work.
    durations = sorted(((r.nodeid, r.when, round(r.duration, 2), round(getattr(r, "machine_cpu_s", None) or 0, 1))
                        for r in reports if hasattr(r, "duration")), key=lambda row: -row[2])
    started, busy_before = config.stash.get(_SESSION, (time.monotonic(), _machine_busy_s()))
    wall, busy = time.monotonic() - started, _machine_busy_s() - busy_before
    if wall >= 60:
        terminalreporter.write_line(f"the machine during the tests: {busy:.0f} busy CPU-seconds in {wall:.0f} s, "
                                    f"{busy / wall:.2f} of its {os.cpu_count()} cores on average ({DURATIONS_FILE})")
    os.makedirs(os.path.dirname(DURATIONS_FILE), exist_ok=True)
    with open(DURATIONS_FILE, "w") as f:
        json.dump(durations, f, indent=0)


def pytest_configure(config):
    config.addinivalue_line("markers", "unit: TensorFlow only, no Spark")
    config.addinivalue_line("markers", "spark: needs a real Spark (local[2] or standalone)")
    config.addinivalue_line("markers", "parallel: starts several Horovod ranks over Gloo")
    config.addinivalue_line("markers", "slow: takes more than about 20 seconds")
    config.addinivalue_line("markers", "docker: builds the cluster image and runs a compose cluster (Docker Engine)")
    config.addinivalue_line("markers", "machine: uses what the whole machine shares (network namespaces, iptables, "
                                       "the Docker engine, the shared standalone cluster): never beside another such test")


#: make test's lanes: the main one (the first pytest-xdist worker), and the one-core one of pytest.ini's
#: one_core_modules and then the one of its beside_modules (the second worker, in that order).
MAIN_LANE, ONE_CORE_LANE, BESIDE_LANE = "main", "one-core", "beside"
WORKER_LANES = {"gw0": (MAIN_LANE,), ONE_CORE_WORKER: (ONE_CORE_LANE, BESIDE_LANE)}
LANE_WORKER = {name: worker for worker, lanes in WORKER_LANES.items() for name in lanes}
#: A test module that imports from these makes network namespaces (and sweeps away stale ones: tests/netns.py).
_NETNS_MODULES = ("tests.netns", "tests.netns_cluster")


def uses_the_machine(item) -> bool:
    """Whether a test uses what the whole machine shares: network namespaces and iptables, the Docker engine, the
    shared standalone cluster (two such tests side by side would tear down each other's namespaces and bridges)."""
    module = getattr(item, "module", None)
    uses_netns = any(getattr(v, "__module__", None) in _NETNS_MODULES for v in vars(module).values()) if module else False
    return bool(uses_netns or item.get_closest_marker("machine") or item.get_closest_marker("docker")
                or "standalone_cluster" in getattr(item, "fixturenames", ()))


def lane(config, nodeid: str) -> str:
    """The lane a test runs in: the one-core lane for the modules pytest.ini's ``one_core_modules`` names (path
    prefixes), the beside lane for its ``beside_modules``, else the main one. pytest-xdist's controller places tests
    knowing only their node ids, so the rule is by path; :func:`pytest_collection_modifyitems` checks what each test
    of the second worker's lanes uses."""
    module = nodeid.split("::")[0]
    for name, key in ((ONE_CORE_LANE, "one_core_modules"), (BESIDE_LANE, "beside_modules")):
        if module.startswith(tuple(config.getini(key))):
            return name
    return MAIN_LANE


def pytest_xdist_make_scheduler(config, log):
    """make test's two workers in three lanes (:func:`lane`). The first worker (gw0) takes the main lane, every test
    in collection order, one after another, as one process runs them: module fixtures made once, and the tests that
    use what the whole machine shares (namespaces, the Docker engine, the shared cluster) never side by side. The
    second (gw1, TensorFlow at one thread) takes the one-core lane, then the beside lane. The split is fixed, not
    taken by whichever worker is free first, so that a module runs in the same worker, with the same threads, on
    every run. A lane whose worker is missing (one worker, or one that crashed and was replaced) goes to whichever
    worker asks next. This is pytest-xdist's scope scheduler with the lane as the scope, through xdist's own hook
    (its ``--dist loadgroup`` does not group on pytest 9.2: pytest-xdist#1386)."""
    from xdist.scheduler import LoadScopeScheduling

    class Lanes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return lane(self.config, nodeid)

        def _assign_work_unit(self, node) -> None:
            workers = {n.gateway.id for n in self.nodes}
            own = [name for name in WORKER_LANES.get(node.gateway.id, ()) if name in self.workqueue]
            free = own + [name for name in self.workqueue if LANE_WORKER[name] not in workers]
            if not free:
                return
            work_unit = self.workqueue.pop(free[0])
            self.assigned_work.setdefault(node, {})[free[0]] = work_unit
            collection = self.registered_collections[node]
            node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])

        def schedule(self) -> None:
            assert self.collection_is_completed
            if self.collection is not None:
                for node in self.nodes:
                    self._reschedule(node)
                return
            if not self._check_nodes_have_same_collection():
                self.log("**Different tests collected, aborting run**")
                return
            self.collection = list(next(iter(self.registered_collections.values())))
            for nodeid in self.collection:
                self.workqueue.setdefault(self._split_scope(nodeid), {})[nodeid] = False
            for node in self.nodes:
                self._assign_work_unit(node)
            for node in self.nodes:  # a worker stops once its lane is done and nothing is left to take
                self._reschedule(node)

    return Lanes(config, log)


def pytest_addoption(parser):
    parser.addini("one_core_modules", "in-process TensorFlow test modules (path prefixes) that keep one core busy: "
                  "make test runs them in a second pytest-xdist worker, with TensorFlow at one thread, beside the "
                  "rest", type="linelist", default=[])
    parser.addini("beside_modules", "Spark test modules (path prefixes) that use nothing the whole machine shares: "
                  "make test's second pytest-xdist worker runs them after the one_core_modules, beside the rest",
                  type="linelist", default=[])


def pytest_collection_modifyitems(config, items):
    strays, machine = set(), set()
    for item in items:
        unit = not any(item.get_closest_marker(m) for m in ("spark", "parallel", "docker"))
        if unit:
            item.add_marker(pytest.mark.unit)
        where = lane(config, item.nodeid)
        if where == ONE_CORE_LANE and (not unit or uses_the_machine(item)):
            strays.add(item.nodeid.split("::")[0])
        elif where == BESIDE_LANE and uses_the_machine(item):
            machine.add(item.nodeid.split("::")[0])
    if strays:
        raise pytest.UsageError(f"{', '.join(sorted(strays))}: in pytest.ini's one_core_modules, but starts Spark, "
                                "Horovod ranks or Docker, or uses what the whole machine shares (network namespaces, "
                                "the standalone cluster), which would run beside the main lane: take it off the list")
    if machine:
        raise pytest.UsageError(f"{', '.join(sorted(machine))}: in pytest.ini's beside_modules, but uses what the "
                                "whole machine shares (network namespaces, iptables, the Docker engine, the standalone "
                                "cluster), which the main lane's tests use too: take it off the list")


@pytest.fixture
def tmp_dir(tmp_path):
    return str(tmp_path)


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 64 KiB tmpfs mounted for the test (a real full disk), unmounted after; skipped where this process
    may not mount one (it needs root, as CI has; under CI=true such a skip fails)."""
    import subprocess

    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture(scope="session")
def spark():
    """A real local[2] Spark, shared by the whole session (starting one takes seconds)."""
    from tests.spark_utils import local_spark

    session = local_spark(2)
    yield session
    session.stop()
