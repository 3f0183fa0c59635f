"""Exports the three models of benchmarks/bench_onnx.py at benchmark sizes with real PyTorch.

PyTorch is not a tfnet dependency: run this in the environment of export_onnx_fixtures.py::

    /tmp/torchenv/bin/python scripts/export_onnx_bench.py /tmp/onnx_bench

It writes (random weights, eval mode, dynamic batch, no download):

* ``mobilenet_v3.onnx``: torchvision's ``mobilenet_v3_small`` (full width, 1,000 classes), 224x224, opset 17.
* ``unet.onnx``: the fixture's U-Net (reflection and replication padding, InstanceNorm, a grouped
  transposed convolution, bilinear and nearest upsampling) at width 32 on 3x128x128 images, opset 17.
* ``gru_text.onnx``: the fixture's text classifier (embedding 64, a bidirectional two-layer GRU of
  128, 5 classes) on 32 tokens from a vocabulary of 1,000, opset 14.
"""

from __future__ import annotations

import os
import sys

import torch
import torchvision

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from onnx_fixture_models import SmallUNet, TextRNN  # noqa: E402


def main(folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    torch.manual_seed(0)
    table = {
        "mobilenet_v3": (torchvision.models.mobilenet_v3_small(), torch.randn(1, 3, 224, 224), "image", 17),
        "unet": (SmallUNet(c_in=3, width=32, c_out=2), torch.randn(1, 3, 128, 128), "image", 17),
        "gru_text": (TextRNN("gru", vocab=1000, dim=64, hidden=128, classes=5), torch.randint(0, 1000, (1, 32)),
                     "ids", 14),
    }
    for name, (model, x, input_name, opset) in table.items():
        model.eval()
        path = os.path.join(folder, name + ".onnx")
        outputs = ["logits", "state"] if name == "gru_text" else ["out"]
        dynamic = {input_name: {0: "batch"}, outputs[0]: {0: "batch"}}
        torch.onnx.export(model, (x,), path, input_names=[input_name], output_names=outputs, opset_version=opset,
                          dynamic_axes=dynamic, training=torch.onnx.TrainingMode.PRESERVE, dynamo=False)
        print(f"{path}: {os.path.getsize(path) / 1e6:.1f} MB, opset {opset}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/onnx_bench")
