"""The training stage without barrier mode (dynamic allocation on: :mod:`optim.rank.gang`) against the
barrier stage, on ``local[2]``: Spark's ``spark.dynamicAllocation.testing`` makes a local master refuse barrier
stages as a cluster with dynamic allocation does (SPARK-24942), so the plain stage runs in a driver of its own. Same
ranks, same data, same seed: the weights are equal bit for bit, and a rank's own error is the same typed error."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import optim
from optim import TFOptimizer
from tests import digits
from tests.cluster import ROOT
from tfnet import TFNet

pytestmark = [pytest.mark.spark, pytest.mark.parallel]

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)

DRIVER = textwrap.dedent("""
    import json, sys
    import numpy as np
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local[2]").appName("tfnet-gang")
             .config("spark.ui.enabled", "false")
             .config("spark.dynamicAllocation.enabled", "true").config("spark.dynamicAllocation.testing", "true")
             .config("spark.dynamicAllocation.shuffleTracking.enabled", "true").getOrCreate())
    import optim
    from optim import TFOptimizer
    from tests import digits
    from tfnet import TFNet
    x, y = digits.load()
    # Spark itself refuses a barrier stage here, as on a cluster with dynamic allocation on
    try:
        spark.sparkContext.parallelize(range(2), 2).barrier().mapPartitions(lambda it: it).collect()
        print("BARRIER_RAN")
    except Exception as exc:
        print("BARRIER_REFUSED " + json.dumps("SPARK-24942" in str(exc)))
    net = TFNet.from_keras(digits.cnn(classes=10, seed=0))
    opt = TFOptimizer(net, optim.losses.SparseCategoricalCrossentropy(from_logits=True), optim.SGD(0.05, momentum=0.9))
    opt.optimize((x[:256], y[:256]), epochs=2, batch_size=32, shuffle=False, num_workers=2, verbose=0)
    np.savez(sys.argv[1], **net.get_weights())
    # a rank's own error (a null row, found on the rank that reads it)
    rows = [(None if i == 100 else x[i].ravel().tolist(), int(y[i])) for i in range(256)]
    df = spark.createDataFrame(rows, "pixels array<float>, label long")
    data = optim.TFDataset.from_dataframe(df, "pixels", "label", feature_shapes={"pixels": (8, 8, 1)})
    try:
        TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)), optim.losses.SparseCategoricalCrossentropy(
            from_logits=True), optim.SGD(0.05)).optimize(data, epochs=1, batch_size=32, num_workers=2, verbose=0)
    except Exception as exc:
        print("ERROR " + json.dumps({"type": type(exc).__name__, "message": str(exc)}))
    print("RESULT " + json.dumps({"last_run": opt.last_run, "step": opt.global_step}, default=str))
""")


def test_the_plain_stage_equals_the_barrier_stage_bit_for_bit(spark, tmp_path):
    out = tmp_path / "plain.npz"
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(out)], capture_output=True, text=True, timeout=600,
                          cwd=ROOT, env=env)
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in proc.stdout.splitlines() if " " in line}
    assert "RESULT" in lines, proc.stderr[-4000:]
    assert lines["BARRIER_REFUSED"] == "true", lines
    res = json.loads(lines["RESULT"])
    run = res["last_run"]
    assert run["barrier"] is False and run["num_workers"] == 2 and run["attempts"] == 1, run
    assert run["states"] == ["starting", "running", "finished"] and res["step"] == 16
    # a rank's own error: the same typed error as from a barrier stage, not retried
    err = json.loads(lines["ERROR"])
    assert err["type"] == "BadRowError" and err["message"].startswith("Column 'pixels' is null at row "), err
    assert "retrying" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]

    # the barrier stage, in this process's session: the same run
    net = TFNet.from_keras(digits.cnn(classes=10, seed=0))
    x, y = digits.load()
    opt = TFOptimizer(net, SCE, optim.SGD(0.05, momentum=0.9))
    opt.optimize((x[:256], y[:256]), epochs=2, batch_size=32, shuffle=False, num_workers=2, verbose=0)
    assert opt.last_run["barrier"] is True
    plain = np.load(out)
    for name, w in net.get_weights().items():
        np.testing.assert_array_equal(plain[name], w, err_msg=name)
    assert not np.array_equal(w, TFNet.from_keras(digits.cnn(classes=10, seed=0)).get_weights()[name])


CONNECT_DRIVER = textwrap.dedent("""
    import json, sys
    import numpy as np
    from pyspark.sql import SparkSession
    spark = SparkSession.builder.remote(sys.argv[1]).create()
    import optim
    from optim import TFOptimizer
    from tests import digits
    from tfnet import TFNet
    x, y = digits.load()
    sce = optim.losses.SparseCategoricalCrossentropy(from_logits=True)
    try:  # without model_dir the ranks cannot find rank 0's store: said at once, not retried
        TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)), sce, optim.SGD(0.05)).optimize(
            (x[:64], y[:64]), epochs=1, batch_size=32, num_workers=2, verbose=0)
    except Exception as exc:
        print("NO_MODEL_DIR " + json.dumps({"type": type(exc).__name__, "message": str(exc)}))
    net = TFNet.from_keras(digits.cnn(classes=10, seed=0))
    opt = TFOptimizer(net, sce, optim.SGD(0.05, momentum=0.9), model_dir=sys.argv[3])
    opt.optimize((x[:256], y[:256]), epochs=2, batch_size=32, shuffle=False, num_workers=2, verbose=0)
    np.savez(sys.argv[2], **net.get_weights())
    # a rank's own error: Spark runs its task again (local[2,4]: four tries, as a cluster gives), and each re-run
    # fails at once outside the gang, and it is a re-run's error that Spark reports; the cause still reaches the
    # client, once
    rows = [(None if i == 100 else x[i].ravel().tolist(), int(y[i])) for i in range(256)]
    df = spark.createDataFrame(rows, "pixels array<float>, label long")
    data = optim.TFDataset.from_dataframe(df, "pixels", "label", feature_shapes={"pixels": (8, 8, 1)})
    bad = TFOptimizer(TFNet.from_keras(digits.cnn(classes=10, seed=0)), sce, optim.SGD(0.05),
                      model_dir=sys.argv[3] + "-bad")
    try:
        bad.optimize(data, epochs=1, batch_size=32, num_workers=2, verbose=0)
    except Exception as exc:
        print("ERROR " + json.dumps({"type": type(exc).__name__, "message": str(exc)}))
    print("RESULT " + json.dumps({"last_run": opt.last_run, "step": opt.global_step}, default=str))
""")


def test_a_connect_server_with_dynamic_allocation_runs_the_plain_stage_to_the_barrier_stages_weights(spark, tmp_path):
    """Under Spark Connect the store is rank 0's and no barrier ``allGather`` spreads its address: the ranks find
    it through a file in ``model_dir``. Same ranks, data and seed as the barrier stage: the same weights."""
    from tests.connect_server import ConnectServer

    server = ConnectServer(master="local[2,4]", conf={"spark.dynamicAllocation.enabled": "true",
                                          "spark.dynamicAllocation.testing": "true",
                                          "spark.dynamicAllocation.shuffleTracking.enabled": "true"}).start()
    try:
        out = tmp_path / "plain.npz"
        env = {**os.environ, "PYTHONPATH": ROOT}
        proc = subprocess.run([sys.executable, "-c", CONNECT_DRIVER, server.url, str(out), str(tmp_path / "run")],
                              capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    finally:
        server.stop()
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in proc.stdout.splitlines() if " " in line}
    assert "RESULT" in lines, proc.stderr[-4000:]
    refused = json.loads(lines["NO_MODEL_DIR"])
    assert refused["type"] == "DistributedTrainingError" and "give TFOptimizer a model_dir" in refused["message"]
    res = json.loads(lines["RESULT"])
    run = res["last_run"]
    assert run["mode"] == "connect" and run["barrier"] is False and run["attempts"] == 1, run
    assert run["states"] == ["starting", "running", "finished"] and res["step"] == 16
    # the bad row's rank failed; its task's re-runs found no gang: the client still gets the rank's own typed error,
    # on the first attempt
    err = json.loads(lines["ERROR"])
    assert err["type"] == "BadRowError" and err["message"].startswith("Column 'pixels' is null at row "), err
    assert "retrying" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    net = TFNet.from_keras(digits.cnn(classes=10, seed=0))
    x, y = digits.load()
    TFOptimizer(net, SCE, optim.SGD(0.05, momentum=0.9)).optimize((x[:256], y[:256]), epochs=2, batch_size=32,
                                                                  shuffle=False, num_workers=2, verbose=0)
    plain = np.load(out)
    for name, w in net.get_weights().items():
        np.testing.assert_array_equal(plain[name], w, err_msg=name)
