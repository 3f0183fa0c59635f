"""The Horovod collective without Spark: two real ranks (processes) over Gloo on loopback, meeting
through tfnet's secured rendezvous store (each rank through its request-signing proxy). The ranks run with Keras
unloaded (optim.horovod_import), and Horovod's Keras layer still loads when asked for."""

import textwrap

import pytest

from tests.horovod_utils import result_of, run_rank_pair

pytestmark = pytest.mark.parallel

RANK = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    from optim.transport.client import GlooProxy
    from optim.training.horovod import HorovodSession, horovod_env

    rank, port, key = int(sys.argv[1]), int(sys.argv[2]), bytes.fromhex(sys.argv[3])
    os.environ.pop("HOROVOD_RANK", None)
    proxy = GlooProxy(("127.0.0.1", port), key, timeout_s=30)
    env = horovod_env(rank, 2, proxy.address[0], proxy.address[1], "lo", 30)
    with HorovodSession(env, on_close=proxy.stop) as session:
        c = session.collective
        summed = c.allreduce_sum(np.array([1.0, 2.0]) * (rank + 1))
        bcast = c.broadcast([np.full(3, rank, np.float32), np.array([rank], np.int64)], root=1)
        obj = c.broadcast_json({"from": rank, "values": [rank, 0.5]}, root=0)
        import tensorflow as tf
        grads, loss = c.reducer()({"w": tf.constant([float(rank), 2.0 * rank])}, tf.constant(float(rank)))
        out = {"rank": c.rank, "size": c.size, "sum": summed.tolist(), "bcast": [b.tolist() for b in bcast],
               "obj": obj, "avg": grads["w"].numpy().tolist(), "loss": float(loss), "max": c.allreduce_max(rank)}
        out["loaded"] = sorted(m for m in ("keras", "sklearn", "matplotlib") if m in sys.modules)
    import horovod.tensorflow as hvd
    layer = hvd.SyncBatchNormalization  # Horovod's Keras layer, and Keras with it, on first use
    import keras
    from horovod.tensorflow.sync_batch_norm import SyncBatchNormalization
    out["layer"] = [layer.__module__, issubclass(layer, keras.layers.BatchNormalization),
                    layer is SyncBatchNormalization]
    out["env_restored"] = "HOROVOD_RANK" not in os.environ and "HOROVOD_GLOO_RENDEZVOUS_PORT" not in os.environ
    print("RESULT " + json.dumps(out), flush=True)
""")


def test_two_ranks_over_gloo_without_spark(tmp_path):
    outs = []
    for rc, stdout, stderr in run_rank_pair(RANK, tmp_path):
        assert rc == 0, stderr[-3000:]
        outs.append(result_of(stdout))
    for r, out in enumerate(outs):
        assert out["rank"] == r and out["size"] == 2
        assert out["sum"] == [3.0, 6.0]                      # 1*[1,2] + 2*[1,2]
        assert out["bcast"] == [[1.0, 1.0, 1.0], [1]]        # rank 1's arrays everywhere
        assert out["obj"] == {"from": 0, "values": [0, 0.5]}  # sent as bytes, never unpickled
        assert out["avg"] == [0.5, 1.0] and out["loss"] == 0.5  # gradients and loss averaged
        assert out["max"] == 1
        # Horovod's import left Keras (and scikit-learn, matplotlib) unloaded: 1.4 CPU-s of a rank's start
        assert out["loaded"] == [], out["loaded"]
        assert out["layer"] == ["horovod.tensorflow.sync_batch_norm", True, True]
        assert out["env_restored"], "Horovod's variables are removed after the rank ends"



# Rank 1's process ends at once after one allreduce (as a task that Ctrl-C or a lost executor kills); rank 0 then
# meets the closed connection in its next allreduce. argv[4]: the log level tfnet gives Horovod ("" for none).
PEER_GONE = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    from optim.transport.client import GlooProxy
    from optim.training.horovod import HorovodSession, horovod_env

    rank, port, key, level = int(sys.argv[1]), int(sys.argv[2]), bytes.fromhex(sys.argv[3]), sys.argv[4]
    proxy = GlooProxy(("127.0.0.1", port), key, timeout_s=30)
    env = horovod_env(rank, 2, proxy.address[0], proxy.address[1], "lo", 30, log_level=level or None)
    with HorovodSession(env, on_close=proxy.stop) as session:
        first = session.collective.allreduce_sum(np.array([1.0]))
        if rank == 1:
            os._exit(0)
        try:
            session.collective.allreduce_sum(np.array([1.0]))
            raised = None
        except Exception as exc:  # TensorFlow's UnknownError around Horovod's shutdown
            from optim.transport.failures import from_exception
            raised = ["Horovod has been shut down" in str(exc), from_exception(exc).retryable]
    print("RESULT " + json.dumps({"first": first.tolist(), "raised": raised}), flush=True)
""")


def test_a_departed_peer_leaves_no_horovod_log_where_the_ranks_share_the_console(tmp_path):
    """On a local master the ranks' stderr is the user's console: with the level tfnet gives Horovod there
    (optim.launch.stage.horovod_log_level), the surviving rank raises Horovod's error, and its C++ log of the lost
    connection ("Horovod background loop uncaught exception: ... Connection reset by peer"), which made Ctrl-C
    print a sixth line, stays out. With Horovod's default level (argument "") the same run prints it: tried."""
    (rc0, stdout0, stderr0), (rc1, _, stderr1) = run_rank_pair(PEER_GONE, tmp_path, args=("fatal",),
                                                               env={"HOROVOD_LOG_LEVEL": ""})
    assert rc0 == 0 and rc1 == 0, (stderr0[-3000:], stderr1[-3000:])
    out = result_of(stdout0)
    assert out == {"first": [2.0], "raised": [True, True]}, out  # the peer's loss, read as one (retryable)
    assert "Horovod background loop" not in stderr0 and "operations.cc" not in stderr0, stderr0[-3000:]


def test_horovod_log_level_is_quiet_only_on_the_users_console(monkeypatch):
    from optim.launch.stage import horovod_log_level
    from optim.training.horovod import horovod_env

    monkeypatch.delenv("TFNET_VERBOSE", raising=False)
    monkeypatch.delenv("HOROVOD_LOG_LEVEL", raising=False)
    assert horovod_log_level(1, console=True) == "fatal"
    assert horovod_log_level(1, console=False) is None  # an executor's own log: Horovod's default
    assert horovod_log_level(2, console=True) is None   # verbose=2 shows everything
    assert horovod_env(0, 2, "127.0.0.1", 1, None, 30, log_level="fatal")["HOROVOD_LOG_LEVEL"] == "fatal"
    assert "HOROVOD_LOG_LEVEL" not in horovod_env(0, 2, "127.0.0.1", 1, None, 30)
    monkeypatch.setenv("HOROVOD_LOG_LEVEL", "debug")  # the user's own, in the executors' environment
    assert "HOROVOD_LOG_LEVEL" not in horovod_env(0, 2, "127.0.0.1", 1, None, 30, log_level="fatal")
    monkeypatch.delenv("HOROVOD_LOG_LEVEL")
    monkeypatch.setenv("TFNET_VERBOSE", "1")
    assert horovod_log_level(1, console=True) is None
