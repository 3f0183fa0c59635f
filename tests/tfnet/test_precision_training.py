"""bf16 fine-tuning: forward and backward in bfloat16 with float32 master weights, optimiser state
and loss; the digits transfer task reaches fp32's held-out accuracy; a CPU without bf16 warns and
runs fp32; unknown precisions are typed errors."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import optim
from optim.errors import PrecisionError, PrecisionWarning
from tests import models
from tests.tfnet import transfer
from tfnet import TFNet, precision

pytestmark = pytest.mark.timeout(300)

#: The tests of tfnet's bf16 road take the ``bf16_kernels`` fixture (tests/bf16_kernels.py: oneDNN's kernels, or
#: TensorFlow's emulation on a CPU without bfloat16); this one is for the few that only native bfloat16 can run
needs_native_bf16 = pytest.mark.skipif(not (precision.cpu_has_bf16() and precision.onednn_enabled()),
                                       reason="this CPU has no native bfloat16, or oneDNN is off")



def _step_pair(net, lr=0.05):
    sce = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def loss(t, o):
        return sce(t, o)

    return net.train_step(loss, lr), net.train_step(loss, lr, precision="bf16")


def test_bf16_step_computes_in_bf16_and_keeps_float32_master_weights(bf16_kernels):
    net = TFNet.from_keras(models.small_cnn(classes=3))
    x = models.random_images(16, 8, seed=1)
    y = np.arange(16) % 3
    fp32, bf16 = _step_pair(net)
    assert bf16.precision == "bf16" and fp32.precision == "fp32"
    before = net.get_weights()
    r32 = fp32(x, y, fp32.init_state())
    after32 = net.get_weights()
    net.set_weights(before)
    r16 = bf16.run(x, y)
    after16 = net.get_weights()
    assert r16.loss.dtype == tf.float32
    # bfloat16 keeps 8 bits of mantissa: the loss is close to fp32's, and not equal to it
    assert float(r16.loss) != float(r32.loss)
    assert abs(float(r16.loss) - float(r32.loss)) < 0.02 * abs(float(r32.loss))
    assert all(v.dtype == tf.float32 for v in net.weight_variables.values())
    assert all(a.dtype == np.float32 for a in after16.values())
    moved = [n for n in net.trainable if not np.array_equal(after16[n], before[n])]
    assert moved == list(net.trainable)  # every weight took the bf16 update, in float32
    for n in net.trainable:  # SGD: the update is -lr * gradient; bf16's is close to fp32's
        d16, d32 = after16[n] - before[n], after32[n] - before[n]
        assert np.linalg.norm(d16 - d32) < 0.1 * np.linalg.norm(d32), n
    # the rewrite is only on while the bf16 step runs: fp32 functions stay fp32, bit for bit
    assert not tf.config.optimizer.get_experimental_options().get("auto_mixed_precision_onednn_bfloat16", False)
    net.set_weights(before)
    np.testing.assert_array_equal(fp32(x, y, fp32.init_state()).loss.numpy(), r32.loss.numpy())


def test_the_bf16_step_casts_a_folded_kernel_to_bf16_once_and_never_back(bf16_kernels):
    """The graph TensorFlow ran (its run metadata: after Grappler's mixed-precision rewrite) holds no kernel-sized float32 ->
    bfloat16 -> float32 round trip. A frozen Keras graph reads each kernel through an ``Identity``; the folded batch
    norm reads the kernel twice (the folded kernel and its scale's gradient, one in bfloat16, the other in float32),
    and through that ``Identity`` the rewrite cast it to bfloat16 and back: a kernel-sized pair of casts (53 a ResNet-50
    step, 6 ms of 0.7 s on AMD EPYC Zen 5). The fold reads the weight itself."""
    from tensorflow.python.eager import context

    net = TFNet.from_keras(models.small_cnn(classes=3))
    assert net.graph.folded == 1
    _, bf16 = _step_pair(net)
    x, y = models.random_images(16, 8, seed=1), np.arange(16) % 3
    context.enable_run_metadata()
    try:
        bf16.run(x, y)
        ran = context.export_run_metadata()
    finally:
        context.disable_run_metadata()
    nodes = {n.name: n for f in ran.function_graphs for g in f.partition_graphs for n in g.node}
    casts = {name: n for name, n in nodes.items() if n.op == "Cast"}
    assert any(n.attr["DstT"].type == tf.bfloat16.as_datatype_enum for n in casts.values()), sorted(casts)
    trips = to_bf16_and_back(casts)
    # a weight, as read from its variable, is cast to bfloat16 once and never back (what may be left, a batch norm's
    # per-channel scale computed in the step, is a vector: 4 values here)
    weights_back = [back.name for back, there in trips if nodes[there.input[0].split(":")[0]].op == "ReadVariableOp"]
    assert weights_back == [], weights_back


def to_bf16_and_back(casts: dict) -> list:
    """``(cast to float32, the cast to bfloat16 it reads)`` pairs, in a graph whose Cast nodes are ``casts`` (by
    name)."""
    found = []
    for back in casts.values():
        there = casts.get(back.input[0].split(":")[0])
        if (there is not None and there.attr["DstT"].type == tf.bfloat16.as_datatype_enum
                and back.attr["DstT"].type == tf.float32.as_datatype_enum):
            found.append((back, there))
    return found


def test_a_bf16_step_in_one_thread_leaves_another_threads_fp32_functions_fp32(bf16_kernels):
    """The bf16 rewrite is this thread's: a fresh thread's fp32 forward, its function instantiated while a
    bf16 step trains in another thread, equals the same forward run alone, bit for bit (with the rewrite set
    process-wide it came out at bf16's precision, 4.3e-3 from it, 19 times in 20). The control: the same net
    instantiated inside the rewrite in this thread is at bf16's precision, so the comparison can tell."""
    import threading

    import keras

    def conv_net():
        keras.utils.set_random_seed(1)
        return TFNet.from_keras(keras.Sequential([
            keras.Input((32, 32, 8)), keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(64, 3, padding="same"), keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)]))

    x = np.random.default_rng(0).normal(size=(16, 32, 32, 8)).astype(np.float32)
    alone = conv_net().forward(x)
    _, bf16 = _step_pair(conv_net(), lr=1e-9)
    stop = threading.Event()

    def train():
        while not stop.is_set():
            bf16.run(x, np.arange(16) % 10)

    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    outs = []
    try:
        for _ in range(8):
            worker = threading.Thread(target=lambda: outs.append(conv_net().forward(x)))
            worker.start()
            worker.join(60)
    finally:
        stop.set()
        trainer.join(60)
    assert len(outs) == 8
    for out in outs:
        np.testing.assert_array_equal(out, alone)
    with precision.bf16_rewrite():
        inside = conv_net().forward(x)
    assert np.abs(inside - alone).max() > 1e-4 * np.abs(alone).max()


def test_bf16_fine_tuning_of_digits_reaches_fp32_accuracy(bf16_kernels):
    _, (xte, yte) = transfer.data()
    fp32 = transfer.fine_tune()
    bf16 = transfer.fine_tune(precision="bf16")
    acc32 = transfer.accuracy(fp32.net.forward(xte), yte)
    acc16 = transfer.accuracy(bf16.net.forward(xte), yte)
    assert acc32 >= 0.95 and abs(acc16 - acc32) <= 0.01, (acc32, acc16)
    assert all(v.dtype == tf.float32 for v in bf16.net.weight_variables.values())
    assert bf16.state and all(np.asarray(s).dtype in (np.float32, np.int64, np.int32) for s in bf16.state)
    assert any(np.asarray(s).dtype == np.float32 and np.asarray(s).size > 1 for s in bf16.state)  # Adam moments
    assert not np.array_equal(bf16.net.forward(xte), fp32.net.forward(xte))  # trained differently: in bf16


def test_cpu_without_bf16_warns_once_and_runs_fp32(monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx2", "fma"}))  # a Zen 3's /proc/cpuinfo
    monkeypatch.setattr(precision, "_warned", set())
    net = TFNet.from_keras(models.small_cnn(classes=3))
    x, y = models.random_images(8, 8, seed=2), np.arange(8) % 3
    with pytest.warns(PrecisionWarning, match="no native bfloat16.*training runs in fp32"):
        fp32, bf16 = _step_pair(net)
    assert bf16.precision == "fp32" and bf16.requested_precision == "bf16"
    before = net.get_weights()
    loss16 = bf16(x, y, bf16.init_state()).loss.numpy()
    net.set_weights(before)
    np.testing.assert_array_equal(loss16, fp32(x, y, fp32.init_state()).loss.numpy())
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per process, not per step
        net.train_step(lambda t, o: tf.reduce_mean(o), 0.1, precision="bf16")


def test_onednn_off_warns_and_runs_fp32(monkeypatch):
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx2", "avx512f", "avx512_bf16"}))
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(precision, "_warned", set())
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    with pytest.warns(PrecisionWarning, match="oneDNN kernels are off"):
        assert precision.training_precision("bf16") == "fp32"


@pytest.mark.parametrize("cap,native", [("AVX2", False), ("avx512_core", False), ("AVX512_CORE_BF16", True),
                                        ("ALL", True), ("", True)])
def test_a_onednn_cap_below_bf16_warns_and_runs_fp32(monkeypatch, cap, native):
    """On a CPU with bfloat16, ``ONEDNN_MAX_CPU_ISA`` below oneDNN's bfloat16 kernels (as a Zen 3 is emulated): the
    step runs fp32 with a warning naming the cap. Asked for bf16 anyway, TensorFlow sends the matmuls to oneDNN,
    which has no kernel for them under the cap, and the process aborted (every bf16 test under the cap)."""
    from optim.predict.quantize import effective_precision

    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx2", "avx512f", "avx512_bf16"}))
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "1")
    monkeypatch.setattr(precision, "_warned", set())
    assert precision.cpu_has_bf16() is native
    if native:
        assert precision.training_precision("bf16") == "bf16" == effective_precision("bf16", "tensorflow")
        return
    with pytest.warns(PrecisionWarning, match=f"oneDNN is capped below its bfloat16 kernels .ONEDNN_MAX_CPU_ISA="
                                              f"{cap.lower()}.; training runs in fp32"):
        assert precision.training_precision("bf16") == "fp32"
    for backend in ("tensorflow", "openvino"):  # OpenVINO's CPU plugin honours the cap too
        with pytest.warns(PrecisionWarning, match="ONEDNN_MAX_CPU_ISA"):
            assert effective_precision("bf16", backend) == "fp32"


def test_unknown_precision_is_a_typed_error():
    net = TFNet.from_keras(models.small_cnn(classes=3))
    with pytest.raises(PrecisionError, match=r"one of \['fp32', 'bf16'\]. Received: precision='fp16'") as info:
        net.train_step(lambda t, o: tf.reduce_mean(o), 0.1, precision="fp16")
    assert isinstance(info.value, ValueError)
    opt = optim.TFOptimizer(net, "mse", optim.SGD(0.1))
    with pytest.raises(PrecisionError, match="Received: precision='int8'"):
        opt.optimize((np.zeros((4, 8, 8, 3), np.float32), np.zeros((4, 3), np.float32)), precision="int8", verbose=0)


@needs_native_bf16
@pytest.mark.spark
@pytest.mark.parallel
def test_bf16_fine_tuning_on_two_spark_ranks_equals_the_local_bf16_run(spark):
    """Two ranks of a real local[2] Spark take the local run's global batches (numpy rows r, r + 2,
    ... on rank r, in order), each half in bf16. After one step (SGD with momentum) their move equals
    the local bf16 run's within bf16's rounding (2^-7 of the move: twice bfloat16's unit roundoff,
    as the two halves round apart), ten times closer than the fp32 step is; after four steps within
    2% of the move, five times closer. The weights and the momentum stay float32.

    Native bfloat16 only: the ranks are Spark's Python workers, which the ``bf16_kernels`` fixture (this process)
    does not reach, and the bounds are oneDNN's rounding. Under TensorFlow's Eigen emulation (AMD EPYC Zen 3, the
    rank split forced on by hand) the two halves' bf16 step came 2.0e-2 of the move from the local bf16 run's: a
    quarter of its distance from fp32 (8.5e-2), not 2^-7."""
    from optim import TFOptimizer
    from tests import digits

    x, y = digits.load()
    x, y = x[:256], y[:256]
    start = list(TFNet.from_keras(digits.cnn(classes=10, seed=0)).get_weights().values())

    def run(precision, steps, num_workers=None):
        net = TFNet.from_keras(digits.cnn(classes=10, seed=0))
        opt = TFOptimizer(net, transfer.SCE, optim.SGD(0.05, momentum=0.9))
        opt.optimize((x, y), batch_size=32, shuffle=False, max_steps=steps, num_workers=num_workers, verbose=0,
                     precision=precision)
        assert opt.global_step == steps
        return net, opt

    def apart(a, b):
        """How far apart two runs' weights are, as a fraction of how far the first moved."""
        wa, wb = list(a.get_weights().values()), list(b.get_weights().values())
        gap = np.sqrt(sum(np.sum((p - q) ** 2) for p, q in zip(wa, wb)))
        return float(gap / np.sqrt(sum(np.sum((p - s) ** 2) for p, s in zip(wa, start))))

    for steps, within, closer in ((1, 2.0 ** -7, 10), (4, 0.02, 5)):
        ranks, opt = run("bf16", steps, num_workers=2)
        local16, _ = run("bf16", steps)
        local32, _ = run("fp32", steps)
        assert apart(ranks, local16) < within, (steps, apart(ranks, local16))
        assert apart(ranks, local32) > closer * apart(ranks, local16), (steps, apart(ranks, local32))
        assert all(a.dtype == np.float32 for a in ranks.get_weights().values())
        assert all(v.dtype == tf.float32 for v in ranks.weight_variables.values())
        momentum = [np.asarray(s) for s in opt.state if np.asarray(s).size > 1]
        assert momentum and all(m.dtype == np.float32 for m in momentum)


def test_the_bf16_step_is_within_bf16s_rounding_of_a_float64_twin(bf16_kernels):
    """An oracle apart from tfnet: the same Keras model in float64 (the same weights), its SGD move computed by
    ``tf.GradientTape``. tfnet's fp32 step moves the weights as it does to float32's rounding (1e-4 of the move,
    1.0e-5 measured); the bf16 step within what bfloat16's 8-bit mantissa allows through two convolutions and two
    dense layers (10% of the move; 4.2e-2 measured, about ten times its unit roundoff of 2^-8), and ten times
    further than fp32: a step that computed another gradient, or stayed in fp32, fails."""
    import keras

    from tests import digits

    x, y = digits.load()
    x, y = x[:64], y[:64]
    model = digits.cnn(classes=10, seed=0)
    net = TFNet.from_keras(model)
    fp32, bf16 = _step_pair(net, lr=0.05)
    before = list(net.get_weights().values())
    bf16.run(x, y)
    d16 = [a - b for a, b in zip(net.get_weights().values(), before)]
    net.set_weights(dict(zip(net.weight_names, before)))
    fp32(x, y, fp32.init_state())
    d32 = [a - b for a, b in zip(net.get_weights().values(), before)]

    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float64")
    try:
        twin = digits.cnn(classes=10, seed=0)
    finally:
        keras.config.set_dtype_policy(policy)
    twin.set_weights([w.astype(np.float64) for w in model.get_weights()])
    with tf.GradientTape() as tape:
        logits = twin(x.astype(np.float64))
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
    d64 = [-0.05 * g.numpy() for g in tape.gradient(loss, twin.trainable_variables)]

    def apart(d):
        flat, ref = np.concatenate([a.ravel() for a in d]), np.concatenate([a.ravel() for a in d64])
        return float(np.linalg.norm(flat - ref) / np.linalg.norm(ref))

    print(f"\nfrom the float64 twin: fp32 {apart(d32):.2e}, bf16 {apart(d16):.2e}")
    assert apart(d32) < 1e-4, apart(d32)
    assert apart(d16) < 0.1, apart(d16)  # 4.2e-2 measured (AMD EPYC, avx512_bf16)
    assert apart(d16) > 10 * apart(d32), (apart(d16), apart(d32))
