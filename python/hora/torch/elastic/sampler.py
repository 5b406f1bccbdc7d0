"""A sampler that shards a dataset over the ranks and, after a change of
world, shards what is left of the epoch over the new ranks."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sized
from typing import Any

import torch.utils.data

from hora.common.basics import rank, size


class ElasticSampler(torch.utils.data.Sampler):
    """Like ``DistributedSampler``, but it remembers how much of the epoch
    the ranks have processed (``record_batch``), so that a new world (more
    or fewer ranks) continues with the samples not yet seen. Keep it in the
    ``TorchState``, call ``record_batch`` after each batch and ``set_epoch``
    at the end of each epoch.

    Args:
        dataset: the dataset (its length must not change).
        shuffle: shuffle the indices, the same way on every rank.
        seed: shuffling seed, the same on every rank.
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Starts epoch ``epoch`` with nothing processed. Call it at the end
        of an epoch, so that a half-done epoch is never started over."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Counts a batch of ``batch_size`` samples as processed on every rank."""
        self.processed_num += batch_size * self.num_replicas

    def record_indices(self, indices: list[int]) -> None:
        """Counts ``len(indices)`` samples as processed on every rank."""
        self.processed_num += len(indices) * self.num_replicas

    def state_dict(self) -> dict[str, Any]:
        """The epoch and how many samples of it are processed."""
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continues from a :meth:`state_dict`, re-sharded over the current world."""
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self) -> None:
        """Re-shards the rest of the epoch over the current world."""
        self.num_replicas = size()
        self.rank = rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        indices = list(self.remaining_indices)
        # padded with the first indices so every rank gets as many
        indices += indices[:self.total_size - len(indices)]
        # this rank's, kept as an attribute as Horovod's sampler does
        self.indices = indices[self.rank:self.total_size:self.num_replicas]
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples
