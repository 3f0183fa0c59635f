"""Exports the fixtures of tests/tfnet/test_onnx_embedding_bag.py with real PyTorch (not a tfnet dependency)::

    python -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch onnx onnxscript
    /tmp/torchenv/bin/python tests/tfnet/onnx_embedding_bag_export.py   # tests/fixtures/onnx_embedding_bag/

For each mode ("sum", "mean") an ``nn.EmbeddingBag(10, 4, mode=mode)`` taking ``(indices, offsets)`` (four bags,
the third empty) is exported with ``torch.onnx.export(model, (indices, offsets), path)``: PyTorch's defaults
(the dynamo exporter, opset 20), which write the bags as a ``Loop`` that ``SequenceInsert`` s each bag's row, with
``If`` s on the bag's bounds in its body. ``MODE.npz`` holds the inputs (``in_0``, ``in_1``), PyTorch's output
(``out_0``), a seeded output gradient (``grad_out_0``) and PyTorch's gradient of ``sum(out_0 * grad_out_0)`` with
respect to the embedding (``grad_w/bag.weight``), and ``SGD_STEPS`` steps of plain SGD on the mean squared error
to ``target`` at ``lr``: the loss before each step (``sgd_loss``) and the embedding after them (``sgd_weight``).
"""

from __future__ import annotations

import os

import numpy as np
import torch
from torch import nn

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "onnx_embedding_bag")
SGD_STEPS, LR = 5, 2.0


class Bags(nn.Module):
    def __init__(self, mode: str):
        super().__init__()
        self.bag = nn.EmbeddingBag(10, 4, mode=mode)

    def forward(self, indices, offsets):
        return self.bag(indices, offsets)


def export(mode: str) -> None:
    torch.manual_seed(0)
    model = Bags(mode).eval()
    indices = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0, 7, 7, 1])
    offsets = torch.tensor([0, 3, 7, 7])
    path = os.path.join(OUT, f"{mode}.onnx")
    torch.onnx.export(model, (indices, offsets), path)
    if os.path.exists(path + ".data") and not os.path.getsize(path + ".data"):  # the weights are inline
        os.remove(path + ".data")
    rng = np.random.default_rng(1)
    grad_out = rng.standard_normal((4, 4)).astype(np.float32)
    target = rng.standard_normal((4, 4)).astype(np.float32)
    out = model(indices, offsets)
    (out * torch.from_numpy(grad_out)).sum().backward()
    data = {"in_0": indices.numpy(), "in_1": offsets.numpy(), "out_0": out.detach().numpy(), "grad_out_0": grad_out,
            "grad_w/bag.weight": model.bag.weight.grad.numpy().copy(), "target": target,
            "weight": model.bag.weight.detach().numpy().copy()}
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for _ in range(SGD_STEPS):
        opt.zero_grad()
        loss = ((model(indices, offsets) - torch.from_numpy(target)) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    data["sgd_loss"] = np.array(losses, np.float32)
    data["sgd_weight"] = model.bag.weight.detach().numpy().copy()
    np.savez(os.path.join(OUT, f"{mode}.npz"), **data)
    print(mode, torch.__version__, "losses", losses)  # noqa: T201


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    for m in ("sum", "mean"):
        export(m)
