"""The models of ``python -m hora.bench tf-synthetic``, in Keras: the same
layouts as torch-synthetic's (see :mod:`hora.bench.small_resnet` and
:mod:`hora.bench.small_transformer`), with as many trainable parameters,
and each with its synthetic batch and loss. Every builder takes the Keras
module to build with (Keras 3, or Keras 2 from ``tf_keras``)."""

from __future__ import annotations

import numpy as np

from hora.bench import small_resnet

DESCRIPTIONS = {
    "resnet20": "ResNet-20 (CIFAR-10 layout), 0.27 M parameters",
    "resnet18": "ResNet-18 (ImageNet layout), 11.7 M parameters",
    "transformer": "4-block transformer, 7.4 M parameters, 64 tokens per sample",
}
VOCABULARY, WIDTH, LAYERS, HEADS, SEQUENCE = 8192, 256, 4, 4, 64


def names():
    return sorted(DESCRIPTIONS)


def default_image_size(name):
    return None if name == "transformer" else small_resnet.default_image_size(name)


def _resnet(keras, name, image_size):
    widths, blocks, imagenet_stem, classes, _ = small_resnet.MODELS[name]
    layers = keras.layers

    def conv_bn(x, width, kernel, stride):
        if kernel > 1:
            x = layers.ZeroPadding2D(kernel // 2)(x)
        x = layers.Conv2D(width, kernel, stride, use_bias=False)(x)
        return layers.BatchNormalization(epsilon=1e-5, momentum=0.9)(x)

    inputs = keras.Input((image_size, image_size, 3))
    x = layers.ReLU()(conv_bn(inputs, widths[0], 7 if imagenet_stem else 3,
                              2 if imagenet_stem else 1))
    if imagenet_stem:
        x = layers.MaxPooling2D(3, 2)(layers.ZeroPadding2D(1)(x))
    channels = widths[0]
    for stage, (width, count) in enumerate(zip(widths, blocks)):
        for block in range(count):
            stride = 2 if stage > 0 and block == 0 else 1
            out = layers.ReLU()(conv_bn(x, width, 3, stride))
            out = conv_bn(out, width, 3, 1)
            shortcut = conv_bn(x, width, 1, stride) if stride != 1 or channels != width else x
            x = layers.ReLU()(layers.Add()([out, shortcut]))
            channels = width
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(classes)(x), name=name)


def _transformer(keras):
    layers = keras.layers

    class Positions(layers.Layer):
        """Adds a learned embedding of each position."""

        def build(self, input_shape):
            self.position = self.add_weight(name="position", shape=(SEQUENCE, WIDTH),
                                            initializer="zeros")

        def call(self, x):
            return x + self.position

    tokens = keras.Input((SEQUENCE,), dtype="int32")
    hidden = Positions()(layers.Embedding(VOCABULARY, WIDTH)(tokens))
    for _ in range(LAYERS):
        normed = layers.LayerNormalization(epsilon=1e-5)(hidden)
        attended = layers.MultiHeadAttention(HEADS, WIDTH // HEADS)(normed, normed)
        hidden = layers.Add()([hidden, attended])
        normed = layers.LayerNormalization(epsilon=1e-5)(hidden)
        fed = layers.Dense(WIDTH)(layers.Dense(4 * WIDTH, activation="relu")(normed))
        hidden = layers.Add()([hidden, fed])
    hidden = layers.LayerNormalization(epsilon=1e-5)(hidden)
    return keras.Model(tokens, layers.Dense(VOCABULARY)(hidden), name="transformer")


def build(keras, name, image_size=None):
    """The model ``name`` (``KeyError`` for an unknown one)."""
    if name == "transformer":
        return _transformer(keras)
    if name not in small_resnet.MODELS:
        raise KeyError(name)
    return _resnet(keras, name, image_size or default_image_size(name))


def batch(name, batch_size, image_size, seed):
    """One fixed synthetic (inputs, labels) batch of NumPy arrays."""
    rng = np.random.default_rng(seed)
    if name == "transformer":
        tokens = rng.integers(0, VOCABULARY, (batch_size, SEQUENCE), dtype=np.int32)
        return tokens, np.roll(tokens, -1, axis=1)
    images = rng.standard_normal((batch_size, image_size, image_size, 3), dtype=np.float32)
    return images, rng.integers(0, small_resnet.num_classes(name), batch_size, dtype=np.int32)


def loss(keras):
    """Cross-entropy over classes, or over the vocabulary at every position."""
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)
