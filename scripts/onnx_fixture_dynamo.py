"""Models for the ONNX fixtures exported as a PyTorch user exports them today (issue 32):
``torch.onnx.export(model, (x,), path, dynamic_shapes=...)`` with torch 2.14's defaults (the dynamo
exporter, opset 20, the weights in ``path + ".data"``). Used by export_onnx_fixtures.py.

torchvision's classes (ResNet, MobileNetV3, EfficientNet, ConvNeXt, ViT, Swin, and the LR-ASPP and
DeepLabV3 segmentation heads on a MobileNetV3 backbone) at tiny widths and inputs, and hand-made
``torch.nn`` models: a Transformer encoder with a padding mask, a causal decoder (its mask from
``torch.triu``), a GRU text classifier, a PixelShuffle super-resolution net, and Xception's entry and middle
flows (timm's blocks) at tiny widths, a detector's box head (torchvision's ``roi_align``) and
``nn.Unfold``/``nn.Fold`` patch mixing, and torchvision's ``DeformConv2d`` (DCNv2, offsets and mask from
convolutions). Random weights, no
download; each fixture stays under about 200 KB.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torchvision import models
from torchvision.models.convnext import CNBlockConfig, ConvNeXt
from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf
from torchvision.models.mobilenetv3 import MobileNetV3, _mobilenet_v3_conf
from torchvision.models.resnet import BasicBlock, ResNet
from torchvision.models.segmentation.deeplabv3 import ASPP, DeepLabV3


def resnet():
    """torchvision's ResNet (``BasicBlock``, [1, 1, 1, 1]) at a sixteenth of ResNet-18's widths."""
    model = ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10, width_per_group=64)
    widths = [4, 8, 16, 32]
    model.inplanes = 4
    model.conv1 = nn.Conv2d(3, 4, kernel_size=7, stride=2, padding=3, bias=False)
    model.bn1 = nn.BatchNorm2d(4)
    for i, w in enumerate(widths):
        setattr(model, f"layer{i + 1}", model._make_layer(BasicBlock, w, 1, stride=1 if i == 0 else 2))
    model.fc = nn.Linear(32, 10)
    return model


def mobilenet_v3():
    settings, _ = _mobilenet_v3_conf("mobilenet_v3_small", width_mult=0.1, reduced_tail=True)
    return MobileNetV3(settings, last_channel=16, num_classes=10)


def efficientnet():
    settings, _ = _efficientnet_conf("efficientnet_b0", width_mult=0.1, depth_mult=0.25)
    return EfficientNet(settings, 0.2, last_channel=32, num_classes=10)


def convnext():
    """ConvNeXt's blocks (depthwise 7x7, LayerNorm, layer scale) at widths 8 to 32, one block a stage."""
    settings = [CNBlockConfig(8, 16, 1), CNBlockConfig(16, 32, 1), CNBlockConfig(32, None, 1)]
    model = ConvNeXt(settings, stochastic_depth_prob=0.0, num_classes=10)
    with torch.no_grad():  # layer scale starts at 1e-6: make the blocks count
        for name, p in model.named_parameters():
            if name.endswith("layer_scale"):
                p.fill_(0.5)
    return model


def vit():
    model = models.VisionTransformer(image_size=16, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16,
                                     mlp_dim=32, num_classes=10)
    nn.init.normal_(model.heads.head.weight, std=0.2)
    return model


def swin():
    """Two blocks a stage, so that the second one's windows are shifted: its attention mask is built by
    slice assignment, which the exporter writes as ``ScatterND``."""
    return models.SwinTransformer(patch_size=[2, 2], embed_dim=8, depths=[2, 2], num_heads=[1, 2],
                                  window_size=[2, 2], num_classes=10)


def _backbone():
    """MobileNetV3-Large's features at a tenth of its width, dilated in the last stage (as the
    segmentation models build it), returning the stride-8 and the last features."""
    from torchvision.models._utils import IntermediateLayerGetter

    settings, _ = _mobilenet_v3_conf("mobilenet_v3_large", width_mult=0.1, dilated=True, reduced_tail=True)
    features = MobileNetV3(settings, last_channel=32).features
    stage = [0] + [i for i, b in enumerate(features) if getattr(b, "_is_cn", False)] + [len(features) - 1]
    low, high = stage[-4], stage[-1]
    channels = (features[low].out_channels, features[high].out_channels)
    return IntermediateLayerGetter(features, {str(low): "low", str(high): "high"}), channels


class LRASPPNet(nn.Module):
    """torchvision's LR-ASPP head on the narrow dilated MobileNetV3 backbone: the high branch is
    resized to the low branch's size (``F.interpolate(..., size=low.shape[-2:])``), then to the input's."""

    def __init__(self, classes: int = 3):
        super().__init__()
        backbone, (low, high) = _backbone()
        self.model = models.segmentation.LRASPP(backbone, low, high, classes, inter_channels=16)

    def forward(self, x):
        return self.model(x)["out"]


class DeepLabNet(nn.Module):
    """torchvision's DeepLabV3 (ASPP with atrous rates 12, 24, 36 and image pooling resized back to the
    feature size) at 8 channels on the narrow backbone."""

    def __init__(self, classes: int = 3):
        super().__init__()
        backbone, (_, high) = _backbone()
        head = nn.Sequential(ASPP(high, [12, 24, 36], 8), nn.Conv2d(8, 8, 3, padding=1, bias=False),
                             nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, classes, 1))
        backbone.return_layers = {k: ("out" if v == "high" else v) for k, v in backbone.return_layers.items()}
        self.model = DeepLabV3(backbone, head)

    def forward(self, x):
        return self.model(x)["out"]


class PaddedEncoder(nn.Module):
    """Token ids and a padding mask (True where padded) -> embedding + learnt positions ->
    ``nn.TransformerEncoder`` (two layers, ``src_key_padding_mask``) -> mean over the real tokens."""

    def __init__(self, vocab: int = 40, seq: int = 6, dim: int = 16, heads: int = 2, classes: int = 3):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.1)
        layer = nn.TransformerEncoderLayer(dim, heads, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, ids, padding):
        h = self.encoder(self.embed(ids) + self.pos, src_key_padding_mask=padding)
        keep = (~padding).unsqueeze(-1).to(h.dtype)
        return self.head((h * keep).sum(1) / keep.sum(1).clamp(min=1.0))


class CausalDecoder(nn.Module):
    """A GPT-style decoder: token embedding + positions, two blocks of causal self-attention (scores
    masked above the diagonal with ``torch.triu``) and an MLP, pre-LayerNorm, next-token logits."""

    def __init__(self, vocab: int = 40, seq: int = 6, dim: int = 16, heads: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.1)
        self.heads = heads
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"ln1": nn.LayerNorm(dim), "qkv": nn.Linear(dim, 3 * dim), "proj": nn.Linear(dim, dim),
                           "ln2": nn.LayerNorm(dim), "fc": nn.Linear(dim, 2 * dim), "out": nn.Linear(2 * dim, dim)})
            for _ in range(2))
        self.ln = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids):
        b, t = ids.shape
        h = self.embed(ids) + self.pos[:t]
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["ln1"](h)).split(h.shape[-1], dim=-1)
            q, k, v = (z.reshape(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
            scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
            future = torch.triu(torch.ones_like(scores), diagonal=1)  # Trilu on a run-time tensor
            att = torch.softmax(scores - 1e4 * future, dim=-1)
            h = h + blk["proj"]((att @ v).transpose(1, 2).reshape(b, t, -1))
            h = h + blk["out"](F.gelu(blk["fc"](blk["ln2"](h))))
        return self.lm_head(self.ln(h))


class GRUText(nn.Module):
    """Token ids -> embedding -> a bidirectional GRU -> the last step -> logits."""

    def __init__(self, vocab: int = 30, dim: int = 8, hidden: int = 8, classes: int = 3):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.gru = nn.GRU(dim, hidden, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * hidden, classes)

    def forward(self, ids):
        seq, _ = self.gru(self.embed(ids))
        return self.head(seq[:, -1])


class SuperResolution(nn.Module):
    """The PyTorch tutorial's super-resolution net (ESPCN): convolutions, then ``nn.PixelShuffle(3)``
    (ONNX ``DepthToSpace``) to a 3x larger image, and its inverse ``nn.PixelUnshuffle`` (``SpaceToDepth``)
    to check the round trip's layout."""

    def __init__(self, upscale: int = 3, width: int = 8):
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 5, padding=2)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1)
        self.conv3 = nn.Conv2d(width, upscale ** 2, 3, padding=1)
        self.shuffle = nn.PixelShuffle(upscale)
        self.unshuffle = nn.PixelUnshuffle(upscale)

    def forward(self, x):
        y = self.shuffle(self.conv3(torch.tanh(self.conv2(torch.tanh(self.conv1(x))))))
        return y, self.unshuffle(y * y)


class SeparableConv(nn.Module):
    """Xception's separable convolution (timm's ``SeparableConv2d``): a depthwise 3x3, then a pointwise 1x1, no biases."""

    def __init__(self, inc: int, outc: int):
        super().__init__()
        self.depthwise = nn.Conv2d(inc, inc, 3, padding=1, groups=inc, bias=False)
        self.pointwise = nn.Conv2d(inc, outc, 1, bias=False)

    def forward(self, x):
        return self.pointwise(self.depthwise(x))


class XceptionBlock(nn.Module):
    """Xception's block (timm's ``xception.Block``): ``reps`` times ReLU, separable convolution, batch norm; a
    strided block ends in a max pool and its skip is a strided 1x1 convolution with its batch norm; then ``rep + skip``."""

    def __init__(self, inc: int, outc: int, reps: int, stride: int = 1, start_with_relu: bool = True):
        super().__init__()
        self.skip = None
        if outc != inc or stride != 1:
            self.skip = nn.Sequential(nn.Conv2d(inc, outc, 1, stride=stride, bias=False), nn.BatchNorm2d(outc))
        rep = []
        for i in range(reps):
            rep += [nn.ReLU(), SeparableConv(inc if i == 0 else outc, outc), nn.BatchNorm2d(outc)]
        if not start_with_relu:
            rep = rep[1:]
        if stride != 1:
            rep.append(nn.MaxPool2d(3, stride, 1))
        self.rep = nn.Sequential(*rep)

    def forward(self, x):
        return self.rep(x) + (x if self.skip is None else self.skip(x))


class XceptionNet(nn.Module):
    """Xception's entry and middle flows at tiny widths: a stem, a strided block, two middle blocks, a head. Each middle
    block's sum is read by the next block's ReLU and by its sum: the ``Conv, BiasAdd, Add`` that TensorFlow's remapper
    fuses and deletes though another op reads it (tfnet.remapper_guard), with the batch norms folded by the export."""

    def __init__(self, width: int = 16, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.entry = XceptionBlock(8, width, 2, stride=2, start_with_relu=False)
        self.middle = nn.Sequential(*(XceptionBlock(width, width, 3) for _ in range(2)))
        self.fc = nn.Linear(width, classes)

    def forward(self, x):
        x = torch.relu(self.middle(self.entry(self.stem(x))))
        return self.fc(x.mean(dim=(2, 3)))


class RoiHead(nn.Module):
    """A two-stage detector's box head on fixed proposals: a small backbone, then torchvision's ``roi_align``
    (ONNX ``RoiAlign``) of the same boxes on every image, aligned with 2 samples a bin side and unaligned with the
    adaptive grid (``sampling_ratio=-1``), and a linear classifier of each pooled region. Boxes cross the map's border,
    lie past it and one is smaller than a pixel; ``spatial_scale`` 0.5 (the features are at half the image's size)."""

    BOXES = [[2.0, 3.0, 20.0, 17.0], [-6.0, 10.0, 9.0, 30.0], [12.0, 0.0, 40.0, 14.0], [5.0, 5.0, 5.5, 5.6],
             [0.0, 0.0, 31.0, 31.0]]

    def __init__(self, width: int = 6, classes: int = 4):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, width, 3, stride=2, padding=1), nn.ReLU(),
                                      nn.Conv2d(width, width, 3, padding=1))
        self.register_buffer("boxes", torch.tensor(self.BOXES))
        self.aligned = nn.Linear(width * 9, classes)
        self.adaptive = nn.Linear(width * 4, classes)

    def forward(self, x):
        from torchvision.ops import roi_align

        features = self.backbone(x)
        n, k = x.shape[0], self.boxes.shape[0]
        index = torch.arange(n, dtype=x.dtype).repeat_interleave(k)[:, None]
        rois = torch.cat([index, self.boxes.repeat(n, 1)], 1)  # (n * k, 5): image, x1, y1, x2, y2
        aligned = roi_align(features, rois, (3, 3), spatial_scale=0.5, sampling_ratio=2, aligned=True)
        adaptive = roi_align(features, rois, (2, 2), spatial_scale=0.5, sampling_ratio=-1, aligned=False)
        return (self.aligned(aligned.flatten(1)).reshape(n, k, -1),
                self.adaptive(torch.tanh(adaptive).flatten(1)).reshape(n, k, -1))


class RoiPoolHead(nn.Module):
    """Fast R-CNN's head on fixed regions: a small backbone, torchvision's ``roi_pool`` (ONNX ``MaxRoiPool``: only the
    legacy exporter writes it) into 3x2 bins at half the image's scale, and a linear classifier of each region. The
    regions cross the border, lie past it (empty bins), are smaller than a pixel, and have corners that round half
    away from zero. Features through ``tanh`` (no ties for a bin's maximum)."""

    ROIS = [[0, 1.2, 2.5, 9.0, 7.4], [1, -3.0, 0.0, 5.0, 20.0], [0, 4.0, 4.0, 4.2, 4.4], [1, 10.5, 0.5, 30.0, 3.0],
            [1, 3.0, 5.0, 13.0, 11.0], [0, 40.0, 40.0, 50.0, 50.0]]

    def __init__(self, width: int = 4, classes: int = 3):
        super().__init__()
        self.backbone = nn.Conv2d(3, width, 3, padding=1)
        self.register_buffer("rois", torch.tensor(self.ROIS))
        self.fc = nn.Linear(width * 6, classes)

    def forward(self, x):
        from torchvision.ops import roi_pool

        pooled = roi_pool(torch.tanh(self.backbone(x)), self.rois, (3, 2), spatial_scale=0.5)
        return self.fc(pooled.flatten(1))


class PatchMixer(nn.Module):
    """``nn.Unfold``'s overlapping patches mixed by a ``Linear`` and summed back by ``nn.Fold`` (ONNX ``Col2Im``), as
    patch-based inpainting and T2T-ViT's soft split write it: 3x3 blocks, stride 2, padding 1; then a dilated fold
    (2x2 blocks, dilation 2) of the result's own dilated patches."""

    def __init__(self, width: int = 4, size: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.unfold = nn.Unfold(3, padding=1, stride=2)
        self.mix = nn.Linear(width * 9, width * 9)
        self.fold = nn.Fold((size, size), 3, padding=1, stride=2)
        self.unfold2 = nn.Unfold(2, dilation=2)
        self.fold2 = nn.Fold((size, size), 2, dilation=2)

    def forward(self, x):
        patches = self.mix(self.unfold(self.stem(x)).transpose(1, 2)).transpose(1, 2)
        y = self.fold(torch.tanh(patches))
        return y, self.fold2(self.unfold2(y) * torch.sigmoid(self.unfold2(torch.cat([x, x[:, :1]], 1))))


class DeformableBlock(nn.Module):
    """A modulated deformable convolution (DCNv2) as detectors write it: offsets and a sigmoid mask predicted by plain
    convolutions from the features, then torchvision's ``DeformConv2d`` (ONNX ``DeformConv``) with 2 groups, 2 offset
    groups, stride 2 and padding; then an unmodulated, dilated one (3x3, dilation 2) and a linear head. The offsets are
    scaled so that taps move several pixels and fall outside the map."""

    def __init__(self, width: int = 8, classes: int = 4):
        super().__init__()
        from torchvision.ops import DeformConv2d

        self.stem = nn.Conv2d(3, width, 3, padding=1)
        self.offset = nn.Conv2d(width, 2 * 2 * 9, 3, stride=2, padding=1)
        self.mask = nn.Conv2d(width, 2 * 9, 3, stride=2, padding=1)
        self.deform = DeformConv2d(width, width, 3, stride=2, padding=1, groups=2)
        self.offset2 = nn.Conv2d(width, 2 * 9, 3, padding=1)
        self.deform2 = DeformConv2d(width, width, 3, padding=2, dilation=2, bias=False)
        self.fc = nn.Linear(width, classes)

    def forward(self, x):
        f = torch.relu(self.stem(x))
        f = torch.relu(self.deform(f, 3.0 * self.offset(f), torch.sigmoid(self.mask(f))))
        f = torch.relu(self.deform2(f, 2.0 * self.offset2(f)))
        return self.fc(f.mean(dim=(2, 3)))


def _tiny_two_stage(width: int, classes: int, size: int) -> dict:
    """The arguments torchvision's two-stage detectors share here: a two-convolution backbone, anchors of 2 sizes and
    3 ratios, 4x4 box regions, a two-layer box head of 16, images of ``size``."""
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
    from torchvision.ops import MultiScaleRoIAlign

    backbone = nn.Sequential(nn.Conv2d(3, width, 3, stride=2, padding=1), nn.ReLU(),
                             nn.Conv2d(width, width, 3, stride=2, padding=1), nn.ReLU())
    backbone.out_channels = width
    return dict(backbone=backbone, rpn_anchor_generator=AnchorGenerator(((8, 16),), ((0.5, 1.0, 2.0),)),
                box_roi_pool=MultiScaleRoIAlign(["0"], output_size=4, sampling_ratio=2),
                box_head=TwoMLPHead(width * 16, 16), box_predictor=FastRCNNPredictor(16, classes), min_size=size,
                max_size=size, image_mean=[0.5] * 3, image_std=[0.25] * 3, box_score_thresh=0.05)


def _redraw(model: nn.Module, seed: int) -> None:
    """Every parameter drawn again, normal with deviation 0.3 (wider than torchvision's initialisation)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.3)


class TinyDetector(nn.Module):
    """torchvision's two-stage ``FasterRCNN`` at a tiny size: a two-convolution backbone, its region proposal network
    (anchors of 2 sizes and 3 ratios, top-k, box decoding, clipping, NMS), ``MultiScaleRoIAlign`` and a two-layer box
    head, then the post-processing (softmax, per-class boxes, score threshold, batched NMS, top detections). One image
    in (C, H, W: the list torchvision's detectors take, of one), boxes, scores and labels out. Weights drawn wider than
    torchvision's initialisation, so that scores differ and the NMS has something to choose."""

    def __init__(self, width: int = 8, classes: int = 4):
        super().__init__()
        from torchvision.models.detection import FasterRCNN

        self.detector = FasterRCNN(**_tiny_two_stage(width, classes, 64), rpn_pre_nms_top_n_test=60,
                                   rpn_post_nms_top_n_test=20, box_detections_per_img=12)
        _redraw(self, 7)

    def forward(self, image):
        found = self.detector([image])[0]
        return found["boxes"], found["scores"], found["labels"]


class TinyMaskDetector(nn.Module):
    """torchvision's ``MaskRCNN`` at the size of :class:`TinyDetector`, with a one-layer mask head on 7x7 regions:
    each detection's mask pasted into the image at its box's size, a ``Loop`` over the detections whose ``Resize``
    sizes are known only at run time."""

    def __init__(self, width: int = 8, classes: int = 3):
        super().__init__()
        from torchvision.models.detection import MaskRCNN
        from torchvision.models.detection.mask_rcnn import MaskRCNNHeads, MaskRCNNPredictor
        from torchvision.ops import MultiScaleRoIAlign

        self.detector = MaskRCNN(
            **_tiny_two_stage(width, classes, 48), mask_roi_pool=MultiScaleRoIAlign(["0"], output_size=7, sampling_ratio=2),
            mask_head=MaskRCNNHeads(width, [width], 1), mask_predictor=MaskRCNNPredictor(width, width, classes),
            rpn_pre_nms_top_n_test=40, rpn_post_nms_top_n_test=16, box_detections_per_img=6)
        _redraw(self, 8)

    def forward(self, image):
        found = self.detector([image])[0]
        return found["boxes"], found["scores"], found["labels"], found["masks"]


def legacy_fixtures(rng) -> dict:
    """Models exported with the legacy exporter (``dynamo=False``, opset 17): the segmentation heads, whose graphs
    compute the resize sizes from ``Shape`` at run time (the dynamo export folds them), the detectors and a Fast R-CNN
    head (the dynamo exporter cannot trace the first or translate ``roi_pool``):
    name -> (model factory, inputs, output names, opset, dynamic axes)."""
    image = {"image": rng.standard_normal((2, 3, 32, 32)).astype("float32")}
    dyn = {"image": {0: "batch"}, "out": {0: "batch"}}
    one = {"image": rng.random((3, 64, 64)).astype("float32")}  # torchvision's detectors take images, not a batch
    return {"lraspp": (LRASPPNet, image, ["out"], 17, dyn), "deeplabv3": (DeepLabNet, image, ["out"], 17, dyn),
            "faster_rcnn": (TinyDetector, one, ["boxes", "scores", "labels"], 17, {}),
            "mask_rcnn": (TinyMaskDetector, {"image": rng.random((3, 48, 48)).astype("float32")},
                          ["boxes", "scores", "labels", "masks"], 17, {}),
            "roi_pool": (RoiPoolHead, {"image": rng.standard_normal((2, 3, 16, 20)).astype("float32")}, ["logits"], 17,
                         {})}


def dynamo_fixtures(rng) -> dict:
    """name -> (model factory, inputs, output names, dynamic batch), seeded; exported with
    ``torch.onnx.export``'s defaults."""
    def image(size, channels=3):
        return {"image": rng.standard_normal((2, channels, size, size)).astype("float32")}

    ids = rng.integers(0, 40, (2, 6)).astype("int64")
    padding = np.array([[False] * 6, [False] * 4 + [True] * 2])
    return {
        "dyn_resnet": (resnet, image(32), ["logits"]),
        "dyn_mobilenet_v3": (mobilenet_v3, image(32), ["logits"]),
        "dyn_efficientnet": (efficientnet, image(32), ["logits"]),
        "dyn_convnext": (convnext, image(32), ["logits"]),
        "dyn_vit": (vit, image(16), ["logits"]),
        "dyn_swin": (swin, image(8), ["logits"]),
        "dyn_encoder": (PaddedEncoder, {"ids": ids, "padding": padding}, ["logits"]),
        "dyn_decoder": (CausalDecoder, {"ids": ids}, ["logits"]),
        "dyn_gru_text": (GRUText, {"ids": ids[:, :5] % 30}, ["logits"]),
        "dyn_super_resolution": (SuperResolution, image(8, 1), ["upscaled", "unshuffled"]),
        "dyn_xception": (XceptionNet, image(32), ["logits"]),
        "dyn_roi_head": (RoiHead, image(32), ["aligned", "adaptive"]),
        "dyn_fold": (PatchMixer, image(10), ["folded", "refolded"]),
        "dyn_deform": (DeformableBlock, image(12), ["logits"]),
    }

