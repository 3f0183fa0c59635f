"""LoRA on a PyTorch Transformer encoder exported to ONNX (the committed fixture made by
scripts/export_onnx_fixtures.py), fine-tuned over Spark local[2] with two Horovod ranks: only the
adapters are averaged, and they equal one process's on the same global batches; the base stays bit for
bit, and the merged net's ONNX equals ``forward`` under onnxruntime."""

import re

import numpy as np
import pytest

import optim
from optim import TFOptimizer
from tests.tfnet.onnx_fixtures import path_of
from tfnet import TFNet

ort = pytest.importorskip("onnxruntime")

pytestmark = [pytest.mark.spark, pytest.mark.parallel, pytest.mark.slow]

SCE = optim.losses.SparseCategoricalCrossentropy(from_logits=True)


def token_task(n, seed=0):
    """Token ids (vocabulary 50, 8 positions) and a padding mask; the class is the first token's id mod 3."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 50, (n, 8)).astype("int64")
    mask = np.ones((n, 8), "float32")
    mask[:, 6:] = (rng.random((n, 2)) > 0.5).astype("float32")
    return [ids, mask], (ids[:, 0] % 3).astype("int64")


def test_onnx_encoder_fine_tuned_with_lora_over_two_ranks(spark, tmp_path):
    base = TFNet.from_onnx(path_of("transformer")).cut("logits")
    lora = base.with_lora(re.compile(r"self_attn\.|linear|head\."), rank=4, seed=0)
    assert list(lora.adapters) == ["layer.self_attn.in_proj_weight", "layer.self_attn.out_proj.weight",
                                   "layer.linear1.weight", "layer.linear2.weight", "head.weight"]
    frozen = {n: v for n, v in lora.get_weights().items() if n not in lora.adapter_names}
    adapter_bytes = sum(lora.weight_variables[n].numpy().nbytes for n in lora.adapter_names)
    every_bytes = sum(v.nbytes for v in lora.get_weights().values())
    assert adapter_bytes < every_bytes / 5

    x, y = token_task(256)
    # SGD with momentum, not Adam: Adam's update hardly changes when every gradient is scaled, so averaging wrongly
    # (summing the ranks' gradients) would pass a comparison under Adam
    opt = TFOptimizer(lora, SCE, optim.SGD(0.1, momentum=0.9), model_dir=str(tmp_path / "run"))
    history = opt.optimize((x, y), epochs=3, batch_size=32, num_workers=2, shuffle=False, verbose=0)
    assert history["loss"][-1] < history["loss"][0], history["loss"]
    # one process on the same global batches (rank r takes rows r, r + 2, ... of each batch of 32, in order):
    # the same adapters after the 24 steps, to float32's reduction order
    alone = base.with_lora(re.compile(r"self_attn\.|linear|head\."), rank=4, seed=0)
    TFOptimizer(alone, SCE, optim.SGD(0.1, momentum=0.9)).optimize((x, y), epochs=3, batch_size=32, shuffle=False,
                                                                    verbose=0)
    for name in lora.adapter_names:
        ours, theirs = lora.weight_variables[name].numpy(), alone.weight_variables[name].numpy()
        assert np.abs(ours - theirs).max() <= 1e-5 * max(1.0, np.abs(theirs).max()), (name, np.abs(ours - theirs).max())
    assert all(np.any(alone.weight_variables[ad.b].numpy()) for ad in alone.adapters.values())
    # a ring allreduce of 2 ranks sends the payload once: the adapters' gradients and the loss, nothing else
    assert history["bytes_per_step"] == [adapter_bytes + 4] * 3
    after = lora.get_weights()
    for name, value in frozen.items():
        assert np.array_equal(after[name], value), name
    assert all(np.any(after[ad.b]) for ad in lora.adapters.values()), "every B moved from zero"

    path = str(tmp_path / "merged.onnx")
    lora.merged().save_onnx(path)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    tx, _ = token_task(16, seed=1)
    got = session.run(["logits"], {"ids": tx[0], "mask": tx[1]})[0]
    np.testing.assert_allclose(got, lora.forward(tx), rtol=1e-4, atol=1e-5)
    assert np.abs(got - base.forward(tx)).max() > 1e-3
