"""Shared test set-up. Tiers, selected with -m:

* unit: no Spark (TensorFlow only);
* spark: a real Spark (local[2], or a standalone master and workers);
* parallel: real Horovod ranks over Gloo;
* docker: the cluster image and a compose cluster on a real Docker engine (tests/docker/; set up by
  scripts/docker_env.sh, never skipped in CI).

``make test TEST_WORKERS=2`` runs two pytest workers (pytest-xdist): each test module goes whole to one worker (its module-scoped
fixtures are made once), and the modules that use what the whole machine shares (pytest.ini's ``machine_modules``:
network namespaces and iptables, the Docker engine, the standalone cluster of ``tests/cluster_fixture.py``) go to one
worker, one after another (:func:`pytest_xdist_make_scheduler`).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# gcsfs 2026.3 and later ask the Storage Control API (gRPC over TLS) what kind each bucket is, before every
# operation, and retry for 60 s where it is not there: the GCS emulator of the tests (tests/gcs_server.py) has no
# such API. gcsfs reads this at import, so it is set before anything imports it; Spark's Python workers,
# started later, inherit it.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
# Every JVM the tests start (drivers, executors, Connect servers; the standalone master and workers) compiles with
# the client compiler only: tests/spark-conf/spark-defaults.conf says why. Not pytest's own (_own_jvm_keeps_c2).
TEST_SPARK_CONF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spark-conf")
os.environ.setdefault("SPARK_CONF_DIR", TEST_SPARK_CONF)
os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", "-XX:TieredStopAtLevel=1")

import json  # noqa: E402
import re  # noqa: E402

import pytest  # noqa: E402

#: The standalone cluster that test_cluster.py and test_elastic.py share (its ``cluster`` fixture).
pytest_plugins = ["tests.cluster_fixture"]


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
        if os.environ.get("SPARK_CONF_DIR") != TEST_SPARK_CONF:
            return launch(*args, **kwargs)
        del os.environ["SPARK_CONF_DIR"]
        try:
            return launch(*args, **kwargs)
        finally:
            os.environ["SPARK_CONF_DIR"] = TEST_SPARK_CONF

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


def pytest_terminal_summary(terminalreporter):
    """One line for the hardware skips, with the CPU that caused them; every duration to DURATIONS_FILE."""
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if HARDWARE_SKIPS.search(_skip_reason(r))]
    if skipped:
        from tfnet.precision import cpu_flags, cpu_model  # imports TensorFlow (3 s): only where the line is written

        flags = sorted(cpu_flags() & {"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8"})
        terminalreporter.write_line(f"hardware skips: {len(skipped)} test(s) need a feature this CPU lacks "
                                    f"({cpu_model()}; flags {' '.join(flags) or 'none of note'})")
    # (a set-up or teardown that passed is filed under "": the module fixtures' clusters and image builds)
    durations = sorted(((r.nodeid, r.when, round(r.duration, 2), round(getattr(r, "machine_cpu_s", None) or 0, 1))
                        for key in ("passed", "failed", "error", "")
                        for r in terminalreporter.stats.get(key, []) if hasattr(r, "duration")),
                       key=lambda row: -row[2])
    wall, busy = sum(row[2] for row in durations), sum(row[3] for row in durations)
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


#: The pytest-xdist group of every test that uses what the whole machine shares.
MACHINE_GROUP = "machine"
#: A test module that imports from these makes network namespaces (and sweeps away stale ones: tests/netns.py).
_NETNS_MODULES = ("tests.netns", "tests.netns_cluster")


def uses_the_machine(item) -> bool:
    """Whether a test uses what the whole machine shares: network namespaces and iptables, the Docker engine, the
    shared standalone cluster (two such tests side by side would tear down each other's namespaces and bridges)."""
    module = getattr(item, "module", None)
    uses_netns = any(getattr(v, "__module__", None) in _NETNS_MODULES for v in vars(module).values()) if module else False
    return bool(uses_netns or item.get_closest_marker("machine") or item.get_closest_marker("docker")
                or "standalone_cluster" in getattr(item, "fixturenames", ()))


def worker_group(config, nodeid: str) -> str:
    """The group a test runs in under pytest-xdist: ``machine`` for the modules pytest.ini's ``machine_modules``
    names (path prefixes), else the test's module. pytest-xdist's controller places tests knowing only their node
    ids, so the rule is by path; :func:`pytest_collection_modifyitems` checks it against what each test uses."""
    module = nodeid.split("::")[0]
    return MACHINE_GROUP if module.startswith(tuple(config.getini("machine_modules"))) else module


def pytest_xdist_make_scheduler(config, log):
    """``make test TEST_WORKERS=2``'s workers take whole groups (:func:`worker_group`): a module's tests in one worker (its module
    fixtures are made once) and the ``machine`` group's in one worker, one after another. pytest-xdist's own
    ``--dist loadgroup`` does not group on pytest 9.2 (pytest-xdist#1386: it renames node ids, which pytest 9.2 no
    longer lets it do), so this is its scope scheduler with the group as the scope, through xdist's own hook."""
    from xdist.scheduler import LoadScopeScheduling

    # groups in collection order, not xdist's default of most tests first: tests/docker/ is collected first, so the
    # machine group, the longest by far, starts at once and the other worker takes the modules one at a time
    config.option.loadscopereorder = False

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(self.config, nodeid)

    return ByGroup(config, log)


def pytest_addoption(parser):
    parser.addini("machine_modules", "test modules (path prefixes) that use what the whole machine shares: they run "
                  "in one pytest-xdist worker, one after another", type="linelist", default=[])


def pytest_collection_modifyitems(config, items):
    strays = set()
    for item in items:
        if not any(item.get_closest_marker(m) for m in ("spark", "parallel", "docker")):
            item.add_marker(pytest.mark.unit)
        if uses_the_machine(item) and worker_group(config, item.nodeid) != MACHINE_GROUP:
            strays.add(item.nodeid.split("::")[0])
    if strays:
        raise pytest.UsageError(f"{', '.join(sorted(strays))}: uses what the whole machine shares (network namespaces, "
                                "the Docker engine, the standalone cluster) but is not in pytest.ini's machine_modules, "
                                "so pytest-xdist could run it beside another such test: add it there")


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
