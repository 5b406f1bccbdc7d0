"""The models ``python -m hora.bench torch-synthetic`` trains, each with its
synthetic batch and loss, behind one interface."""

import torch
import torch.nn.functional as F

from hora.bench import small_resnet, small_transformer

DESCRIPTIONS = {
    "resnet20": "ResNet-20 (CIFAR-10 layout), 0.27 M parameters in 65 gradients",
    "resnet18": "ResNet-18 (ImageNet layout), 11.7 M parameters in 62 gradients",
    "transformer": "4-block transformer, 7.4 M parameters in 54 gradients (two of 8 MiB), "
                   "64 tokens per sample",
}

# batch sizes per rank whose compute-only step takes about 50 ms and 500 ms
# on one core of the 2-core test machine (torch 2.13, 1 thread)
STEP_BATCH_SIZES = {"resnet20": (32, 288), "resnet18": (8, 96), "transformer": (2, 20)}


def names():
    return sorted(DESCRIPTIONS)


def build(name, norm=None):
    """The model ``name``; ``norm`` replaces a ResNet's BatchNorm2d (the
    transformer has none and ignores it)."""
    if name == "transformer":
        return small_transformer.SmallTransformer()
    return small_resnet.build(name, norm or torch.nn.BatchNorm2d)


def batch(name, batch_size, image_size, generator):
    """One fixed synthetic (input, target) batch for ``name``."""
    if name == "transformer":
        shape = (batch_size, small_transformer.SEQUENCE)
        tokens = torch.randint(0, small_transformer.VOCABULARY, shape, generator=generator)
        return tokens, torch.roll(tokens, -1, dims=1)
    data = torch.randn(batch_size, 3, image_size, image_size, generator=generator)
    target = torch.randint(0, small_resnet.num_classes(name), (batch_size,), generator=generator)
    return data, target


def loss(output, target):
    """Cross-entropy over classes, or over the vocabulary at every position."""
    return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))


def default_image_size(name):
    return None if name == "transformer" else small_resnet.default_image_size(name)
