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

