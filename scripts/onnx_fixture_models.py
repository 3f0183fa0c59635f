"""Small PyTorch models for the ONNX operator fixtures (issue 23); used by export_onnx_fixtures.py.

Each is narrow and takes a small input, so that its ``.onnx`` and ``.npz`` stay a few tens of KB.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F


class TextRNN(nn.Module):
    """Token ids -> embedding -> a bidirectional two-layer GRU or LSTM -> the last step of both
    directions -> logits; also returns the final hidden states."""

    def __init__(self, cell: str = "gru", vocab: int = 30, dim: int = 8, hidden: int = 6, classes: int = 3):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        rnn = nn.GRU if cell == "gru" else nn.LSTM
        self.rnn = rnn(dim, hidden, num_layers=2, bidirectional=True, batch_first=True)
        self.head = nn.Linear(2 * hidden, classes)

    def forward(self, ids):
        seq, state = self.rnn(self.embed(ids))
        h = state if isinstance(state, torch.Tensor) else state[0]
        return self.head(seq[:, -1]), h


class RecurrentState(nn.Module):
    """An ``nn.RNN`` (tanh, bidirectional, two layers, no initial state), then a ``nn.GRU`` and an
    ``nn.RNN`` (ReLU) started from a given initial state."""

    def __init__(self, features: int = 4, hidden: int = 5):
        super().__init__()
        self.rnn = nn.RNN(features, hidden, num_layers=2, bidirectional=True, batch_first=True)
        self.gru = nn.GRU(2 * hidden, hidden, batch_first=True)
        self.relu_rnn = nn.RNN(hidden, hidden, nonlinearity="relu", batch_first=True)

    def forward(self, x, h0):  # x: (batch, seq, features), h0: (batch, hidden)
        y, _ = self.rnn(x)
        y, h = self.gru(y, h0.unsqueeze(0).contiguous())
        z, hz = self.relu_rnn(y, h)
        return z, (h + hz)[0]


class TemporalCNN(nn.Module):
    """A 1-D temporal CNN: causal dilated convolutions (constant padding), BatchNorm1d, GroupNorm,
    max and average pooling, a residual connection, global pooling and a classifier."""

    def __init__(self, channels: int = 3, width: int = 8, classes: int = 4):
        super().__init__()
        self.conv1 = nn.Conv1d(channels, width, 3, dilation=1)
        self.bn1 = nn.BatchNorm1d(width)
        self.conv2 = nn.Conv1d(width, width, 3, dilation=2, groups=2)
        self.gn = nn.GroupNorm(2, width)
        self.pool = nn.MaxPool1d(2)
        self.conv3 = nn.Conv1d(width, width, 3, stride=2, padding=1)
        self.avg = nn.AvgPool1d(3, stride=1, padding=1, count_include_pad=False)
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(F.pad(x, (2, 0)))))
        h = h + F.relu(self.gn(self.conv2(F.pad(h, (4, 0)))))
        h = self.avg(F.relu(self.conv3(self.pool(h))))
        return self.head(h.mean(-1))


class SmallUNet(nn.Module):
    """A two-level U-Net: reflection and replication padding, InstanceNorm, max pooling, a grouped
    transposed convolution with output padding, bilinear and nearest upsampling, skip concatenation."""

    def __init__(self, c_in: int = 2, width: int = 4, c_out: int = 2):
        super().__init__()

        def block(a, b, pad):
            return nn.Sequential(pad(1), nn.Conv2d(a, b, 3), nn.InstanceNorm2d(b, affine=True), nn.ReLU())

        self.down1 = block(c_in, width, nn.ReflectionPad2d)
        self.down2 = block(width, 2 * width, nn.ReplicationPad2d)
        self.bottom = block(2 * width, 2 * width, nn.ReflectionPad2d)
        self.up_t = nn.ConvTranspose2d(2 * width, width, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.up_b = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.mix = nn.Sequential(nn.ZeroPad2d((1, 1, 1, 1)), nn.Conv2d(3 * width, width, 3))
        self.up_n = nn.Upsample(scale_factor=2, mode="nearest")
        self.out = nn.Conv2d(2 * width, c_out, 1)

    def forward(self, x):
        d1 = self.down1(x)  # (N, w, 8, 8)
        d2 = self.down2(F.max_pool2d(d1, 2))  # (N, 2w, 4, 4)
        b = self.bottom(F.max_pool2d(d2, 2))  # (N, 2w, 2, 2)
        u = torch.cat([self.up_t(b), self.up_b(b)], 1)  # (N, 3w, 4, 4)
        u = self.up_n(F.relu(self.mix(u)))  # (N, w, 8, 8)
        return self.out(torch.cat([u, d1], 1))


class TensorOps(nn.Module):
    """Einsum, ReduceL2, ReduceLogSumExp, CumSum, Where, Expand, Tile, TopK (values), Conv3d with
    3-D max and average pooling, and align-corners and sized bilinear resizes."""

    def __init__(self, dim: int = 6):
        super().__init__()
        self.proj = nn.Parameter(torch.randn(dim, dim) * 0.3)
        self.scale = nn.Parameter(torch.randn(dim) * 0.3 + 1.0)
        self.conv3d = nn.Conv3d(1, 2, 3, padding=1)
        self.conv3d_s = nn.Conv3d(2, 2, (1, 3, 3), stride=(1, 2, 2), groups=2)

    def forward(self, x, v):
        # x: (batch, seq, dim); v: (batch, 1, 4, 6, 6)
        h = torch.einsum("bsd,de->bse", x, self.proj)
        attn = torch.einsum("bsd,btd->bst", h, x)
        norm = torch.linalg.vector_norm(h, dim=-1, keepdim=True)  # ReduceL2
        lse = torch.logsumexp(attn, dim=-1, keepdim=True)
        c = torch.cumsum(h / (norm + 1.0), dim=1) + torch.cumsum(h, dim=2).flip(1) * 0.1
        w = torch.where(h > 0, h * self.scale, 0.1 * c) + lse
        e = self.scale.view(1, 1, -1).expand(x.shape[0], x.shape[1], -1)
        t = w.repeat(1, 2, 1)[:, : x.shape[1]] + e
        top = torch.topk(t, 3, dim=-1).values.sum(-1)
        vv = F.max_pool3d(F.relu(self.conv3d(v)), (1, 2, 2))
        vv = F.avg_pool3d(self.conv3d_s(vv), (2, 1, 1))  # (batch, 2, 2, 2, 2)
        r = F.interpolate(vv.flatten(1, 2), size=(5, 3), mode="bilinear", align_corners=True)
        return top, r.sum((2, 3)) + t.mean(1)[:, :4]


def unique_copy(model: nn.Module) -> nn.Module:
    """A copy whose parameters and buffers all differ (small positive offsets), so that its export
    merges no initializers: the probe that tells which parameters the real export merged."""
    probe = copy.deepcopy(model)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for t in list(probe.parameters()) + list(probe.buffers()):
            if t.is_floating_point():
                t.add_(torch.rand(t.shape, generator=g) * 1e-3 + 1e-4)
    return probe


def _initializer_uses(graph):
    """The graph's nodes other than ``Identity`` of an initializer, and what each such alias stands
    for (the exporter writes a merged parameter as an ``Identity`` of the one initializer kept)."""
    alias = {t.name: t.name for t in graph.initializer}
    nodes = []
    for n in graph.node:
        if n.op_type == "Identity" and n.input[0] in alias:
            alias[n.output[0]] = alias[n.input[0]]
        else:
            nodes.append(n)
    return nodes, alias


def merged_parameters(proto, probe, model: nn.Module, params: dict) -> dict[str, list[str]]:
    """Initializer name -> the parameters the exporter merged into it (at least two, or one under
    another name), read by walking ``proto`` beside the export of :func:`unique_copy` (``probe``,
    the same trace with every parameter its own initializer)."""
    real_nodes, real = _initializer_uses(proto.graph)
    probe_nodes, mine = _initializer_uses(probe.graph)
    assert [n.op_type for n in probe_nodes] == [n.op_type for n in real_nodes], "traces differ"
    to_real: dict[str, str] = {}
    for a, b in zip(probe_nodes, real_nodes):
        for x, y in zip(a.input, b.input):
            if x in mine and y in real:
                to_real.setdefault(mine[x], real[y])
    groups: dict[str, list[str]] = {}
    for name, _ in model.named_parameters():
        if name in to_real:
            groups.setdefault(to_real[name], []).append(name)
    return {k: v for k, v in groups.items() if len(v) > 1 or k not in params}


def fixtures(rng) -> dict:
    """name -> (model factory, inputs, output names, opset, dynamic axes), seeded."""
    b = {0: "batch"}
    ids = rng.integers(0, 30, (2, 6)).astype("int64")
    return {
        "gru_text": (lambda: TextRNN("gru"), {"ids": ids}, ["logits", "state"], 14,
                     {"ids": b, "logits": b, "state": {1: "batch"}}),
        "lstm_text": (lambda: TextRNN("lstm"), {"ids": ids}, ["logits", "state"], 17,
                      {"ids": b, "logits": b, "state": {1: "batch"}}),
        "rnn_state": (RecurrentState, {"x": rng.standard_normal((2, 5, 4)).astype("float32"),
                                       "h0": rng.standard_normal((2, 5)).astype("float32")},
                      ["y", "h"], 13, {"x": b, "h0": b, "y": b, "h": b}),
        "tcn": (TemporalCNN, {"signal": rng.standard_normal((2, 3, 16)).astype("float32")}, ["logits"], 15,
                {"signal": b, "logits": b}),
        "unet": (SmallUNet, {"image": rng.standard_normal((2, 2, 8, 8)).astype("float32")}, ["mask"], 17,
                 {"image": b, "mask": b}),
        "tensor_ops": (TensorOps, {"x": rng.standard_normal((2, 5, 6)).astype("float32"),
                                   "v": rng.standard_normal((2, 1, 4, 6, 6)).astype("float32")},
                       ["top", "mixed"], 18, {"x": b, "v": b, "top": b, "mixed": b}),
    }
