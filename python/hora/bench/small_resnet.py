"""ResNets built from basic blocks, for the synthetic PyTorch benchmark.

torchvision is not needed: ``resnet20`` is the CIFAR-10 network of He et al.
(three stages of 16/32/64 channels, 0.27 M parameters, 32x32 images), small
enough that a batch takes a fraction of a second on one CPU core, and whose
gradients are too small for communication to matter much. ``resnet18``
has the layout of the ImageNet ResNet-18 (64..512 channels, 11.7 M
parameters, 44.6 MiB of float32 gradients), so communication weighs far
more; on a CPU it is run on small images.
"""

from torch import nn

# name -> (channels per stage, blocks per stage, ImageNet stem, classes, default image size)
MODELS = {
    "resnet20": ((16, 32, 64), (3, 3, 3), False, 10, 32),
    "resnet18": ((64, 128, 256, 512), (2, 2, 2, 2), True, 1000, 64),
}


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection; a 1x1 convolution
    matches the shortcut when the block changes the resolution or width."""

    def __init__(self, in_channels, out_channels, stride, norm):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = norm(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = norm(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), norm(out_channels))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, widths, blocks, imagenet_stem, num_classes, norm=nn.BatchNorm2d):
        super().__init__()
        if imagenet_stem:
            stem = [nn.Conv2d(3, widths[0], 7, 2, 3, bias=False), norm(widths[0]),
                    nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
        else:
            stem = [nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), norm(widths[0]),
                    nn.ReLU(inplace=True)]
        layers = stem
        in_channels = widths[0]
        for stage, (width, count) in enumerate(zip(widths, blocks)):
            for block in range(count):
                stride = 2 if stage > 0 and block == 0 else 1
                layers.append(BasicBlock(in_channels, width, stride, norm))
                in_channels = width
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_channels, num_classes)

    def forward(self, x):
        return self.fc(self.pool(self.features(x)).flatten(1))


def build(name, norm=nn.BatchNorm2d):
    """The model called ``name`` (a key of MODELS) with ``norm`` as its
    normalization layer; raises ``KeyError`` for an unknown name."""
    widths, blocks, imagenet_stem, classes, _ = MODELS[name]
    return ResNet(widths, blocks, imagenet_stem, classes, norm)


def num_classes(name):
    return MODELS[name][3]


def default_image_size(name):
    return MODELS[name][4]
