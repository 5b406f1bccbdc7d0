"""A small transformer language model for the synthetic PyTorch benchmark.

Its gradients are shaped unlike a ResNet's: two large ones (the token
embedding and the output projection, 8 MiB of float32 each with the
defaults) at the two ends of the backward pass, and many small ones in
between (every block's attention and feed-forward weights, biases and
layer norms): 54 gradients, 7.4 M parameters. Position embeddings are
learned; attention is not causal (the benchmark times a training step, not
a language model's quality).
"""

import torch
from torch import nn

VOCABULARY = 8192
WIDTH = 256
LAYERS = 4
HEADS = 4
SEQUENCE = 64


class SmallTransformer(nn.Module):
    def __init__(self, vocabulary=VOCABULARY, width=WIDTH, layers=LAYERS, heads=HEADS,
                 sequence=SEQUENCE):
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, width)
        self.position = nn.Parameter(torch.zeros(sequence, width))
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True,
                                       norm_first=True)
            for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocabulary)

    def forward(self, tokens):
        hidden = self.embedding(tokens) + self.position[:tokens.shape[1]]
        for block in self.blocks:
            hidden = block(hidden)
        return self.head(self.norm(hidden))
