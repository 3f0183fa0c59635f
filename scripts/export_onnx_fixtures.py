"""Exports the ONNX test fixtures with real PyTorch (``torch.onnx.export``).

PyTorch is not a tfnet dependency: run this in a separate environment that has ``torch``,
``torchvision``, ``onnx`` and ``scikit-learn``::

    python -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch torchvision onnx scikit-learn
    /tmp/torchenv/bin/python scripts/export_onnx_fixtures.py            # tests/fixtures/onnx/
    /tmp/torchenv/bin/python scripts/export_onnx_fixtures.py --full-resnet18 /tmp/resnet18.onnx

For each model it writes ``NAME.onnx`` and ``NAME.npz`` holding, for one fixed input, PyTorch's
outputs (``out_K``), the output gradient used (``grad_out_K``, seeded normal), and PyTorch's input
gradients (``grad_in_K``, float inputs only) and weight gradients (``grad_w/<ONNX initializer
name>``) of ``sum_K <out_K, grad_out_K>``. Inputs are ``in_K``.

Models (seeded init, eval mode, dynamic batch dimension):

* ``resnet18``: torchvision's ResNet-18 (its ``BasicBlock`` and ``_make_layer``) at a quarter of the
  width (16-32-64-128 channels instead of 64-...-512), 10 classes, 32x32 input, opset 17. The full
  width model is 45 MB; ``--full-resnet18 PATH`` writes it (224x224, 1000 classes) for the benchmark.
* ``mobilenet_v2``: torchvision's MobileNetV2 with ``width_mult=0.25``, 10 classes, 32x32, opset 13.
* ``transformer``: token ids (int64) and a float mask -> embedding + learnt positions, one
  ``nn.TransformerEncoderLayer`` (GELU, batch first) -> two outputs, opset 18.
* ``lstm``: ``nn.LSTM`` (batch first, two layers) + linear head, two outputs, opset 14.
* ``digits_cnn``: a small CNN trained (15 epochs of Adam) on all of scikit-learn's digits 0-4 (8x8,
  901 images), for the transfer test, which fine-tunes it on digits 5-9; opset 15.

Issue 23's fixtures (``--only`` with no names writes them all, ``--only unet vit`` some): hand-made
models in scripts/onnx_fixture_models.py (``gru_text``, ``lstm_text``, ``rnn_state``, ``tcn``,
``unet``, ``tensor_ops``) and torchvision's classes at tiny widths in scripts/onnx_fixture_vision.py.
Where the exporter merged parameters of equal value into one initializer, ``grad_w/<initializer>``
holds the sum of their gradients and ``merged/<initializer>`` their names.

Issue 32's fixtures (``--default-export`` with no names writes them all): exported with
``torch.onnx.export``'s defaults (dynamo, opset 20, external data ``NAME.onnx.data``), models in
scripts/onnx_fixture_dynamo.py; see :func:`export_default` for how their gradients are stored::

    /tmp/torchenv/bin/pip install torch==2.14.1 torchvision==0.29.1 onnx onnxscript
    /tmp/torchenv/bin/python scripts/export_onnx_fixtures.py --default-export
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch
import torchvision
from torch import nn
from torchvision.models.resnet import BasicBlock, ResNet

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "onnx")


class NarrowResNet18(ResNet):
    """torchvision's ResNet-18 with every width divided by ``div``; same blocks, same forward."""

    def __init__(self, div: int = 4, num_classes: int = 10):
        nn.Module.__init__(self)
        self._norm_layer = nn.BatchNorm2d
        self.inplanes = 64 // div
        self.dilation = 1
        self.groups = 1
        self.base_width = 64
        self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(BasicBlock, 64 // div, 2)
        self.layer2 = self._make_layer(BasicBlock, 128 // div, 2, stride=2)
        self.layer3 = self._make_layer(BasicBlock, 256 // div, 2, stride=2)
        self.layer4 = self._make_layer(BasicBlock, 512 // div, 2, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 // div, num_classes)


class Encoder(nn.Module):
    def __init__(self, vocab: int = 50, seq: int = 8, dim: int = 32, heads: int = 4, classes: int = 3):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.1)
        self.layer = nn.TransformerEncoderLayer(dim, heads, 64, dropout=0.0, activation="gelu", batch_first=True)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, ids, mask):
        t = ids.shape[1]
        h = self.embed(ids) + self.pos[:t].unsqueeze(0)
        h = self.layer(h) * mask.unsqueeze(-1)
        h = self.norm(h)
        pooled = h.sum(1) / mask.sum(1, keepdim=True).clamp(min=1.0)
        return self.head(pooled), h


class Recurrent(nn.Module):
    def __init__(self, features: int = 6, hidden: int = 12, classes: int = 4):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        seq, (h, _) = self.lstm(x)
        return self.head(seq[:, -1]), h[-1]


class DigitsCNN(nn.Module):
    def __init__(self, classes: int = 5):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.classifier = nn.Linear(64, classes)

    def forward(self, x):
        return self.classifier(self.features(x))


def digits_split(classes):
    """Digits of the given classes as (N, 1, 8, 8) float32 in [0, 1] and int64 labels 0..k-1."""
    from sklearn.datasets import load_digits

    d = load_digits()
    keep = np.isin(d.target, classes)
    x = (d.images[keep] / 16.0).astype(np.float32)[:, None]
    y = np.searchsorted(np.asarray(classes), d.target[keep]).astype(np.int64)
    return x, y


def pretrain_digits(model: nn.Module) -> float:
    x, y = digits_split([0, 1, 2, 3, 4])
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.Adam(model.parameters(), 3e-3)
    g = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(15):
        perm = torch.randperm(len(xt), generator=g)
        for i in range(0, len(xt), 32):
            idx = perm[i : i + 32]
            opt.zero_grad()
            nn.functional.cross_entropy(model(xt[idx]), yt[idx]).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        return float((model(xt).argmax(1) == yt).float().mean())


def export(model: nn.Module, inputs: dict, outputs: list, path: str, opset: int, dynamic: dict) -> None:
    """Exports ``model`` and stores PyTorch's outputs and gradients beside the ``.onnx`` file."""
    import onnx

    model.eval()
    names = list(inputs)
    args = tuple(torch.from_numpy(v) for v in inputs.values())
    torch.onnx.export(
        model, args, path, input_names=names, output_names=outputs, opset_version=opset,
        dynamic_axes=dynamic, training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False,
        dynamo=False,
    )
    proto = onnx.load(path)
    onnx.checker.check_model(proto)
    inits = {i.name for i in proto.graph.initializer}
    # which parameter became which initializer: the exporter keeps parameter names for the
    # initializers it does not fold
    params = {n: p for n, p in model.named_parameters() if n in inits}

    leaves = [a.clone().requires_grad_(a.is_floating_point()) for a in args]
    for p in model.parameters():
        p.grad = None
    outs = model(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    rng = np.random.default_rng(1)
    grad_outs = [rng.standard_normal(o.shape).astype(np.float32) for o in outs]
    total = sum((o * torch.from_numpy(g)).sum() for o, g in zip(outs, grad_outs))
    total.backward()
    data = {}
    for k, v in enumerate(inputs.values()):
        data[f"in_{k}"] = v
    for k, (o, g) in enumerate(zip(outs, grad_outs)):
        data[f"out_{k}"] = o.detach().numpy()
        data[f"grad_out_{k}"] = g
    for k, leaf in enumerate(leaves):
        if leaf.requires_grad:
            data[f"grad_in_{k}"] = leaf.grad.numpy()
    for name, p in params.items():
        if p.grad is not None:
            data[f"grad_w/{name}"] = p.grad.numpy()
    from onnx_fixture_models import merged_parameters, unique_copy

    probe_path = path[: -len(".onnx")] + ".probe.onnx"
    torch.onnx.export(
        unique_copy(model), args, probe_path, input_names=names, output_names=outputs, opset_version=opset,
        dynamic_axes=dynamic, training=torch.onnx.TrainingMode.PRESERVE, do_constant_folding=False, dynamo=False,
    )
    probe = onnx.load(probe_path)
    os.remove(probe_path)
    for target, group in merged_parameters(proto, probe, model, params).items():
        # the exporter merged parameters of equal value into one initializer: its gradient is their sum
        grads = [p.grad for n, p in model.named_parameters() if n in group and p.grad is not None]
        data[f"grad_w/{target}"] = sum(g.numpy() for g in grads)
        data[f"merged/{target}"] = np.asarray(sorted(group))
    np.savez(path[: -len(".onnx")] + ".npz", **data)
    size = os.path.getsize(path) / 1e6
    print(f"{os.path.basename(path)}: opset {opset}, {size:.2f} MB, {len(params)} named parameters, "
          f"{sum(k.startswith('grad_w/') for k in data)} weight gradients")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=OUT)
    parser.add_argument("--full-resnet18", default=None, help="also write torchvision's full ResNet-18 here")
    parser.add_argument("--only", nargs="*", default=None, help="export only these fixtures (issue 23's by name)")
    parser.add_argument("--default-export", nargs="*", default=None,
                        help="export issue 32's fixtures (torch.onnx.export's defaults), all or these by name")
    args = parser.parse_args()
    if args.default_export is not None:
        return export_default_fixtures(args.out, args.default_export)
    if args.only is not None:
        return export_some(args.out, args.only)
    os.makedirs(args.out, exist_ok=True)
    out = lambda name: os.path.join(args.out, name + ".onnx")  # noqa: E731
    rng = np.random.default_rng(0)
    batch = {0: "batch"}

    torch.manual_seed(0)
    model = NarrowResNet18()
    _randomise_bn(model)
    x = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
    export(model, {"image": x}, ["logits"], out("resnet18"), 17, {"image": batch, "logits": batch})

    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v2(width_mult=0.25, num_classes=10)
    _randomise_bn(model)
    x = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
    export(model, {"image": x}, ["logits"], out("mobilenet_v2"), 13, {"image": batch, "logits": batch})

    torch.manual_seed(0)
    encoder = _jitter(Encoder())
    ids = rng.integers(0, 50, (2, 8)).astype(np.int64)
    mask = np.ones((2, 8), np.float32)
    mask[1, 6:] = 0.0
    export(encoder, {"ids": ids, "mask": mask}, ["logits", "hidden"], out("transformer"), 18,
           {"ids": batch, "mask": batch, "logits": batch, "hidden": batch})

    torch.manual_seed(0)
    x = rng.standard_normal((2, 5, 6)).astype(np.float32)
    export(_jitter(Recurrent()), {"sequence": x}, ["logits", "state"], out("lstm"), 14,
           {"sequence": batch, "logits": batch, "state": {0: "batch"}})

    torch.manual_seed(0)
    model = DigitsCNN()
    acc = pretrain_digits(model)
    print(f"digits_cnn: training accuracy on digits 0-4: {acc:.3f}")
    x = digits_split([0, 1, 2, 3, 4])[0][:4]
    export(model, {"image": x}, ["logits"], out("digits_cnn"), 15, {"image": batch, "logits": batch})

    if args.full_resnet18:
        torch.manual_seed(0)
        model = torchvision.models.resnet18()
        x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
        model.eval()
        torch.onnx.export(model, (torch.from_numpy(x),), args.full_resnet18, input_names=["image"],
                          output_names=["logits"], opset_version=17, dynamic_axes={"image": batch, "logits": batch},
                          training=torch.onnx.TrainingMode.PRESERVE, dynamo=False)
        print(f"full ResNet-18: {args.full_resnet18} ({os.path.getsize(args.full_resnet18) / 1e6:.1f} MB)")


def export_default(model: nn.Module, inputs: dict, outputs: list, path: str) -> None:
    """Exports ``model`` as a PyTorch user does today: ``torch.onnx.export(model, args, path,
    dynamic_shapes=...)`` with torch's defaults (the dynamo exporter, opset 20, the weights in
    ``path + ".data"``), a dynamic batch; stores PyTorch's outputs and gradients beside it.

    The default export optimises the graph: it folds each batch norm into the convolution before it
    (keeping the convolution weight's name for the folded value), transposes ``Linear`` weights into
    new initializers (``val_N``) and slices parameters ahead of time. So the gradients stored are those
    of the initializers: each is matched (by value, unique, within 1e-5) to a parameter of a twin of the
    model with its batch norms folded the same way (``torch.fx.experimental.optimization.fuse``), or to
    its transpose, and that parameter's PyTorch gradient (transposed alike) is stored under the
    initializer's name, with ``source/<initializer>`` naming the parameter. Initializers with no such
    parameter (a constant computed from several) are listed in ``unmatched``.
    """
    import onnx
    from onnx import numpy_helper

    model.eval()
    args = tuple(torch.from_numpy(v) for v in inputs.values())
    batch = torch.export.Dim("batch")
    for suffix in ("", ".data"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    torch.onnx.export(model, args, path, input_names=list(inputs), output_names=outputs,
                      dynamic_shapes=tuple({0: batch} for _ in args))
    proto = onnx.load(path)
    onnx.checker.check_model(proto)
    twin = _folded_twin(model)
    rng = np.random.default_rng(1)
    data = {f"in_{k}": v for k, v in enumerate(inputs.values())}
    leaves = [a.clone().requires_grad_(a.is_floating_point()) for a in args]
    with torch.no_grad():
        reference = model(*args)
    outs = twin(*leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    reference = reference if isinstance(reference, tuple) else (reference,)
    for o, r in zip(outs, reference):
        assert torch.allclose(o, r, rtol=1e-4, atol=1e-5), "the folded twin computes another function"
    grad_outs = [rng.standard_normal(o.shape).astype(np.float32) for o in outs]
    sum((o * torch.from_numpy(g)).sum() for o, g in zip(outs, grad_outs)).backward()
    for k, (r, g) in enumerate(zip(reference, grad_outs)):
        data[f"out_{k}"], data[f"grad_out_{k}"] = r.numpy(), g
    for k, leaf in enumerate(leaves):
        if leaf.requires_grad:
            data[f"grad_in_{k}"] = leaf.grad.numpy()
    params = {n: p for n, p in twin.named_parameters() if p.grad is not None}
    elements = _element_index(params)
    unmatched = []
    for t in proto.graph.initializer:
        value = numpy_helper.to_array(t)
        if value.dtype != np.float32 or value.ndim == 0:
            continue
        hits = [(n, False) for n, p in params.items() if p.shape == value.shape and _close(p, value)]
        hits += [(n, True) for n, p in params.items() if p.ndim == 2 and p.T.shape == value.shape and _close(p.T, value)]
        if len(hits) == 1:
            name, transposed = hits[0]
            grad = params[name].grad.numpy()
            data[f"grad_w/{t.name}"] = grad.T if transposed else grad
            data[f"source/{t.name}"] = np.asarray(name + (" (transposed)" if transposed else ""))
            continue
        # a rearrangement of parameter elements (a recurrent layer's weights repacked in ONNX's gate
        # order): every element found, exactly and once, among the parameters' elements
        found = [elements.get(v) for v in value.ravel().view(np.uint32).tolist()]
        if all(f is not None for f in found) and len(set(found)) == len(found):  # a gather that repeats
            # elements (a relative position bias) is not a rearrangement: its gradient is not theirs
            grads = {n: p.grad.numpy().ravel() for n, p in params.items()}
            data[f"grad_w/{t.name}"] = np.asarray([grads[n][i] for n, i in found], np.float32).reshape(value.shape)
            data[f"source/{t.name}"] = np.asarray(" + ".join(sorted({n for n, _ in found})) + " (elements rearranged)")
            continue
        unmatched.append(t.name)
    data["unmatched"] = np.asarray(unmatched)
    np.savez_compressed(path[: -len(".onnx")] + ".npz", **data)
    size = sum(os.path.getsize(path + s) for s in ("", ".data") if os.path.exists(path + s)) / 1e3
    print(f"{os.path.basename(path)}: opset {[o.version for o in proto.opset_import if o.domain == '']}, {size:.0f} KB, "
          f"{sum(k.startswith('grad_w/') for k in data)} initializer gradients, unmatched {unmatched}")


def _element_index(params: dict) -> dict:
    """float32 bit pattern -> (parameter, flat index), for the values that occur exactly once."""
    index, seen = {}, set()
    for name, p in params.items():
        for i, bits in enumerate(p.detach().numpy().ravel().view(np.uint32).tolist()):
            if bits in seen:
                index.pop(bits, None)
                continue
            seen.add(bits)
            index[bits] = (name, i)
    return index


def _close(p: torch.Tensor, value: np.ndarray) -> bool:
    return np.allclose(p.detach().numpy(), value, rtol=1e-5, atol=1e-7)


def _folded_twin(model: nn.Module) -> nn.Module:
    """``model`` with every batch norm folded into the convolution before it, as the exporter folds
    them; the model itself where there is none to fold (or it cannot be traced)."""
    import copy

    if not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        return copy.deepcopy(model)
    from torch.fx.experimental.optimization import fuse

    twin = fuse(copy.deepcopy(model))
    for p in twin.parameters():  # the folded biases are made without gradients
        p.requires_grad_(True)
    return twin


def export_default_fixtures(folder: str, names) -> None:
    """Issue 32's fixtures: ``torch.onnx.export``'s defaults (scripts/onnx_fixture_dynamo.py). Every
    parameter jittered apart (the exporter would merge equal ones) and batch-norm statistics drawn at
    random."""
    from onnx_fixture_dynamo import dynamo_fixtures

    table = dynamo_fixtures(np.random.default_rng(32))
    for name in names or sorted(table):
        torch.manual_seed(0)
        factory, inputs, outputs = table[name]
        model = _jitter(factory())
        _randomise_bn(model)
        export_default(model, inputs, outputs, os.path.join(folder, name + ".onnx"))


def export_some(folder: str, names) -> None:
    """The issue-23 fixtures: hand-made models (scripts/onnx_fixture_models.py, parameters jittered
    apart) and torchvision's classes (scripts/onnx_fixture_vision.py, their own initialisation, so
    the exporter merges equal parameters), each from its own seed."""
    from onnx_fixture_dynamo import legacy_fixtures
    from onnx_fixture_models import fixtures
    from onnx_fixture_vision import vision_fixtures

    table = fixtures(np.random.default_rng(23))
    table.update(legacy_fixtures(np.random.default_rng(33)))
    vision, dyn = vision_fixtures(np.random.default_rng(24))
    for name in names or sorted(table) + sorted(vision):
        torch.manual_seed(0)
        if name in table:
            factory, inputs, outputs, opset, dynamic = table[name]
            model = _jitter(factory())
        else:
            factory, inputs, opset = vision[name]
            model, outputs, dynamic = factory(), ["logits"], dyn
        if name != "googlenet":  # GoogLeNet keeps torchvision's initialisation, at which the exporter
            _randomise_bn(model)  # merges batch-norm biases with running means (tfnet.onnx.shared_stats)
        export(model, inputs, outputs, os.path.join(folder, name + ".onnx"), opset, dynamic)


def _jitter(model: nn.Module) -> nn.Module:
    """Small noise on every parameter. The exporter merges initializers with equal values (LayerNorm's
    ones, zero biases) into one, which would tie weights that PyTorch trains apart."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    return model


def _randomise_bn(model: nn.Module) -> None:
    """Non-trivial batch-norm statistics and affine parameters, so the tests see them used."""
    g = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.1)


if __name__ == "__main__":
    main()
