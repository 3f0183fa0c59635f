"""Large nets from a Spark Connect client (issue 34): the net and rank 0's result take the same road, the
plan and ``collect()`` when they fit, ``model_dir`` when they do not, so that the Connect server's heap is
never the limit. A real Connect server with Spark's default 1 GiB driver heap (the setting under which a
177 MB result ran the server out of memory and the client hung), local[2], in a process of its own. Every road
returns the weights a classic session's run of the same net, data and settings returns, bit for bit."""

import numpy as np
import pytest

import optim
from optim import TFOptimizer
from optim.config import TrainConfig
from optim.data.arrays import ArrayDataset
from optim.errors import DistributedTrainingError
from optim.launch.stage import carried_bytes, result_bytes
from tests import digits
from tests.connect_server import ConnectServer, close_session
from tests.spark_utils import BIT_FOR_BIT, own_python_workers
from tfnet import TFNet
from tfnet.serialize import net_to_bytes

pytestmark = [pytest.mark.spark, pytest.mark.parallel, pytest.mark.slow]

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


@pytest.fixture(scope="module")
def classic(spark, tmp_path_factory):
    """The weights a classic session's runs return, made before the Connect session opens (a process with a Connect
    session open runs its distributed calls there): the 1.1M-parameter net of the roads test, and the 25.5M one with
    Adam through model_dir."""
    out = {}
    with own_python_workers(spark, BIT_FOR_BIT):
        out["roads"] = list(train(mlp([1024, 1024])).net.get_weights().values())
        big = train(mlp([4096, 4096, 2048]), model_dir=str(tmp_path_factory.mktemp("classic")), method=optim.Adam(1e-3))
        out["25m"] = (list(big.net.get_weights().values()), [np.asarray(s) for s in big.state])
    return out


@pytest.fixture(scope="module")
def session(spark):
    """A client of a Connect server with the default driver heap (after the suite's classic session
    exists: pyspark switches a process to Connect while a Connect session is open)."""
    server = ConnectServer(cores=2, conf={"spark.driver.memory": "1g"}).start()
    client = server.session()
    try:
        yield client
    finally:
        close_session(client)
        server.stop()


def mlp(widths, seed=0) -> TFNet:
    import keras

    keras.utils.set_random_seed(seed)
    layers = [keras.Input((64,), name="pixels")]
    layers += [keras.layers.Dense(w, activation="relu", name=f"dense{i}") for i, w in enumerate(widths)]
    layers += [keras.layers.Dense(10, name="logits")]
    return TFNet.from_keras(keras.Sequential(layers))


def data(rows=64):
    x, y = digits.load()
    return x[:rows].reshape(rows, -1), y[:rows]


def train(net, model_dir=None, method=None, **kw):
    opt = TFOptimizer(net, SCE, method or optim.SGD(0.05), model_dir=model_dir)
    opt.optimize(data(), epochs=1, batch_size=32, num_workers=2, verbose=0, shuffle=False, **kw)
    return opt


def test_the_plan_and_result_limits_at_their_edges(classic, session, tmp_path):
    """A net whose job is exactly the plan limit goes in the plan; one byte less of limit sends it, and the
    result, through model_dir. Rank 0's result (about 4.3 MB) comes back in pieces of 1 MiB. The road does
    not change what is trained: each road's weights are a classic run's, bit for bit."""
    x, y = data()
    runs = {}
    try:
        for road, under_plan, under_result in [("plan", 0, 0), ("file", 1, 0), ("result-file", 0, 1)]:
            net = mlp([1024, 1024])  # 1.1M parameters; measured itself (each Keras model has a name of its own)
            shipped = len(net_to_bytes(net)) + carried_bytes(ArrayDataset.from_tensors((x, y)), None, [])
            result = result_bytes(TFOptimizer(net, SCE, optim.SGD(0.05)), TrainConfig())
            session.conf.set("spark.tfnet.connect.maxPlanBytes", str(shipped - under_plan))
            session.conf.set("spark.tfnet.connect.maxResultBytes", str(result - under_result))
            opt = train(net, model_dir=str(tmp_path / road))
            runs[road] = (opt.net.get_weights(), opt.last_run)
    finally:
        session.conf.unset("spark.tfnet.connect.maxPlanBytes")
        session.conf.unset("spark.tfnet.connect.maxResultBytes")
    assert (runs["plan"][1]["net_via"], runs["plan"][1]["result_via"]) == ("plan", "rows")
    assert runs["plan"][1]["result_pieces"] >= 3, runs["plan"][1]["result_pieces"]  # 1 MiB pieces of ~4.3 MB
    assert (runs["file"][1]["net_via"], runs["file"][1]["result_via"]) == ("file", "file")
    assert (runs["result-file"][1]["net_via"], runs["result-file"][1]["result_via"]) == ("file", "file")
    for road in ("plan", "file", "result-file"):  # the same order, names of their own
        for ours, theirs in zip(runs[road][0].values(), classic["roads"], strict=True):
            np.testing.assert_array_equal(ours, theirs, err_msg=road)
    assert not list((tmp_path / "file").glob(".exchange/*")), "the exchange folder is removed after the run"


def test_a_25m_parameter_net_with_adam_trains_through_model_dir(classic, session, tmp_path):
    """25.5M parameters (102 MB of weights; with Adam's state rank 0's result is 306 MB, past the 177 MB that
    ran a 1 GiB server out of memory): the net and the result go through model_dir, and the server lives on. The
    weights and Adam's state it returns are a classic run's, bit for bit."""
    net = mlp([4096, 4096, 2048])
    assert sum(int(np.prod(v.shape)) for v in net.weight_variables.values()) > 25_000_000
    before = {k: v.copy() for k, v in net.get_weights().items()}
    opt = train(net, model_dir=str(tmp_path / "run"), method=optim.Adam(1e-3))
    assert opt.global_step == 2 and (opt.last_run["net_via"], opt.last_run["result_via"]) == ("file", "file")
    assert len(opt.state) > 0 and all(np.all(np.isfinite(s)) for s in opt.state)
    moved = [k for k, v in opt.net.get_weights().items() if not np.array_equal(v, before[k])]
    assert len(moved) == len(before), "every weight moved"
    weights, state = classic["25m"]
    for ours, theirs in zip(opt.net.get_weights().values(), weights, strict=True):
        np.testing.assert_array_equal(ours, theirs)
    for ours, theirs in zip(opt.state, state, strict=True):
        np.testing.assert_array_equal(np.asarray(ours), theirs)
    assert session.range(3).count() == 3, "the Connect server still answers"


def test_a_25m_parameter_net_without_model_dir_fails_before_the_stage(session):
    opt = TFOptimizer(mlp([4096, 4096, 2048]), SCE, optim.Adam(1e-3))
    with pytest.raises(DistributedTrainingError, match=r"exceed what a Spark Connect plan carries .*Give TFOptimizer a "
                                                        r"model_dir"):
        opt.optimize(data(), epochs=1, batch_size=32, num_workers=2, verbose=0)
    assert opt.global_step == 0
