"""scripts/cpu_by_process.py, the suite's CPU by process and by the test that started it, on real processes."""

import json
import os
import subprocess
import sys
import time

from scripts.cpu_by_process import kind, report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5: pass\n"


def test_a_process_is_counted_with_its_cpu_under_the_test_that_started_it(tmp_path):
    out = str(tmp_path / "cpu.json")
    sampler = subprocess.Popen([sys.executable, os.path.join(ROOT, "scripts", "cpu_by_process.py"), "sample", out])
    try:
        time.sleep(1)  # its first sweep, whose processes count only their CPU after it, is over
        env = dict(os.environ, PYTEST_CURRENT_TEST="tests/optim/test_burn.py::test_burns (call)")
        subprocess.run([sys.executable, "-c", BURN], env=env, check=True, timeout=60)
        time.sleep(1)
    finally:
        open(out + ".stop", "w").close()
        sampler.wait(30)
    with open(out) as f:
        burner = [p for p in json.load(f).values() if "process_time" in p["cmd"]]
    assert len(burner) == 1, burner
    assert burner[0]["test"] == "tests/optim/test_burn.py::test_burns (call)"
    assert 0.9 <= burner[0]["cpu"] - burner[0]["base"] <= 2.5, burner  # 1.5 s burnt, less what one sweep missed
    lines = report(out).splitlines()
    row = next(line for line in lines if "tests/optim/test_burn.py" in line)
    assert float(row.split()[0]) >= 0.9 and "other Python programs" in row, lines


def test_kinds_from_command_lines():
    assert kind("/usr/lib/jvm/java-17/bin/java -cp x org.apache.spark.deploy.SparkSubmit").startswith("JVM")
    assert kind("bash /v/pyspark/bin/spark-class org.apache.spark.deploy.master.Master").startswith("JVM")
    assert kind("/v/bin/python -m optim.spark.worker_daemon pyspark.worker ").startswith("Spark's Python workers")
    assert kind("/v/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))").startswith("pytest-xdist")
    assert kind("/v/bin/python -c print(1)") == "other Python programs"
    assert kind("/v/bin/python -c from optim.spark.worker_daemon import preload") == "other Python programs"


def test_a_daemon_is_a_spark_worker_whose_parent_is_none(tmp_path):
    daemon, worker = "/v/bin/python -m optim.spark.worker_daemon pyspark.worker", "/v/bin/python -m pyspark.daemon"
    seen = {"10:1": {"ppid": 1, "cmd": daemon, "test": "", "cpu": 3.5, "base": 0.0},
            "11:2": {"ppid": 10, "cmd": daemon, "test": "", "cpu": 1.0, "base": 0.0},
            "12:3": {"ppid": 10, "cmd": daemon, "test": "", "cpu": 2.0, "base": 0.0},
            "20:4": {"ppid": 1, "cmd": worker, "test": "", "cpu": 0.5, "base": 0.25}}
    path = tmp_path / "seen.json"
    path.write_text(json.dumps(seen))
    lines = report(str(path)).splitlines()
    assert "  (of Spark's Python workers, 2 daemons: 4 CPU-s; the rest their forks)" in lines, lines
    assert any(line.split()[:2] == ["6.8", "100.0%"] and "Spark's Python workers" in line for line in lines), lines
