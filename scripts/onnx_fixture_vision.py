"""torchvision's model classes at tiny widths and inputs, for the ONNX fixtures (issue 23); used by
export_onnx_fixtures.py. Random weights (each class's own initialisation), no download."""

from __future__ import annotations

from torch import nn
from torchvision import models
from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf
from torchvision.models.googlenet import BasicConv2d, GoogLeNet, Inception
from torchvision.models.mobilenetv3 import MobileNetV3, _mobilenet_v3_conf
from torchvision.models.regnet import BlockParams, RegNet
from torchvision.models.squeezenet import Fire, SqueezeNet


class NarrowSqueezeNet(SqueezeNet):
    """SqueezeNet 1.1's layout (ceil-mode pools, ``Fire`` modules, a convolutional classifier) at
    an eighth of its widths."""

    def __init__(self, num_classes: int = 10):
        nn.Module.__init__(self)
        self.num_classes = num_classes
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, kernel_size=3, stride=2), nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
            Fire(8, 2, 8, 8), Fire(16, 2, 8, 8),
            nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
            Fire(16, 4, 16, 16),
        )
        self.classifier = nn.Sequential(nn.Dropout(0.5), nn.Conv2d(32, num_classes, 1), nn.ReLU(inplace=True),
                                        nn.AdaptiveAvgPool2d((1, 1)))


class NarrowGoogLeNet(GoogLeNet):
    """GoogLeNet's layout (every ``Inception`` block, ceil-mode pools) at a sixteenth of its widths,
    initialised as torchvision does (truncated normal, std 0.01), without auxiliary heads."""

    def __init__(self, num_classes: int = 10):
        nn.Module.__init__(self)
        c = lambda n: max(1, n // 16)  # noqa: E731
        self.aux_logits, self.transform_input = False, False
        self.conv1 = BasicConv2d(3, c(64), kernel_size=7, stride=2, padding=3)
        self.maxpool1 = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        self.conv2 = BasicConv2d(c(64), c(64), kernel_size=1)
        self.conv3 = BasicConv2d(c(64), c(192), kernel_size=3, padding=1)
        self.maxpool2 = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        spec = {"3a": (192, 64, 96, 128, 16, 32, 32), "3b": (256, 128, 128, 192, 32, 96, 64),
                "4a": (480, 192, 96, 208, 16, 48, 64), "4b": (512, 160, 112, 224, 24, 64, 64),
                "4c": (512, 128, 128, 256, 24, 64, 64), "4d": (512, 112, 144, 288, 32, 64, 64),
                "4e": (528, 256, 160, 320, 32, 128, 128), "5a": (832, 256, 160, 320, 32, 128, 128),
                "5b": (832, 384, 192, 384, 48, 128, 128)}
        out = c(192)
        for name, widths in spec.items():
            w = [c(v) for v in widths[1:]]
            setattr(self, f"inception{name}", Inception(out, *w))
            out = w[0] + w[2] + w[4] + w[5]
        self.maxpool3 = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        self.maxpool4 = nn.MaxPool2d(2, stride=2, ceil_mode=True)
        self.aux1 = self.aux2 = None
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(p=0.2)
        self.fc = nn.Linear(out, num_classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.trunc_normal_(m.weight, mean=0.0, std=0.01, a=-2, b=2)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)


def mobilenet_v3():
    """MobileNetV3-Small at a quarter width with the reduced tail, a 64-wide last layer."""
    settings, _ = _mobilenet_v3_conf("mobilenet_v3_small", width_mult=0.25, reduced_tail=True)
    return MobileNetV3(settings, last_channel=64, num_classes=10)


def efficientnet():
    """EfficientNet-B0's stages at a tenth of its width and a quarter of its depth, 64-wide head."""
    settings, _ = _efficientnet_conf("efficientnet_b0", width_mult=0.1, depth_mult=0.25)
    return EfficientNet(settings, 0.2, last_channel=64, num_classes=10)


def mnasnet():
    """MNASNet at alpha 0.1; its 1,280-wide last 1x1 convolution (fixed by the class) narrowed to 64."""
    model = models.MNASNet(0.1, num_classes=10)
    model.layers[14] = nn.Conv2d(model.layers[14].in_channels, 64, 1, bias=False)
    model.layers[15] = nn.BatchNorm2d(64)
    model.classifier[1] = nn.Linear(64, 10)
    return model


def regnet():
    return RegNet(BlockParams.from_init_params(depth=3, w_0=8, w_a=8.0, w_m=2.0, group_width=4, se_ratio=0.25),
                  num_classes=10, stem_width=8)


def vit():
    """A two-layer VisionTransformer on 16x16 images; its zero-initialised head is drawn at random so
    that the output (and every gradient) is not zero."""
    model = models.VisionTransformer(image_size=16, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16,
                                     mlp_dim=32, num_classes=10)
    nn.init.normal_(model.heads.head.weight, std=0.2)
    return model


def vision_fixtures(rng) -> dict:
    """name -> (model factory, inputs, output names, opset, dynamic axes)."""
    def image(size):
        return {"image": rng.standard_normal((2, 3, size, size)).astype("float32")}

    dyn = {"image": {0: "batch"}, "logits": {0: "batch"}}
    return {
        "mobilenet_v3": (mobilenet_v3, image(32), 17),
        "efficientnet": (efficientnet, image(32), 15),
        "regnet": (regnet, image(32), 14),
        "densenet": (lambda: models.DenseNet(growth_rate=4, block_config=(2, 2), num_init_features=8, bn_size=2,
                                             num_classes=10), image(32), 13),
        "shufflenet": (lambda: models.ShuffleNetV2([1, 1, 1], [8, 16, 32, 64, 64], num_classes=10), image(32), 16),
        "squeezenet": (NarrowSqueezeNet, image(32), 13),
        "mnasnet": (mnasnet, image(32), 18),
        "googlenet": (NarrowGoogLeNet, image(32), 17),
        "vit": (vit, image(16), 17),
        "swin": (lambda: models.SwinTransformer(patch_size=[2, 2], embed_dim=8, depths=[1, 1], num_heads=[1, 2],
                                                window_size=[2, 2], num_classes=10), image(8), 17),
    }, dyn
