"""The ways ``python -m hora.bench sharding`` trains one transformer with
Adam: hora replicated and hora with ZeRO stages 1, 2 and 3
(``DistributedOptimizer(..., sharding=...)``), the step alone with no
communication, PyTorch's ``ZeroRedundancyOptimizer`` under DDP, and
PyTorch's FSDP2 (``fully_shard`` on every block and on the whole model),
the last two over gloo. Each variant owns its copy of the model (the same
initial weights everywhere) and follows :mod:`hora.bench.synthetic`'s
interface; each also says how many bytes of optimizer state and of
gradients this rank holds."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch

import hora.torch as hvd
from hora.bench import small_transformer, train_models, train_variants
from hora.bench.implementations import _free_port


class Setup:
    """What every variant trains: the model's shape, its initial weights,
    this rank's batch, the learning rate."""

    def __init__(self, width, layers, vocabulary, sequence, batch_size, rank, lr=1e-4,
                 device=None, bucket_bytes=None):
        self.shape = {"width": width, "layers": layers, "vocabulary": vocabulary,
                      "sequence": sequence, "heads": max(1, width // 64)}
        torch.manual_seed(0)
        self.initial_state = self.build().state_dict()
        generator = torch.Generator().manual_seed(1000 + rank)
        tokens = torch.randint(0, vocabulary, (batch_size, sequence), generator=generator)
        self.device = device or torch.device("cpu")
        self.data = tokens.to(self.device)
        self.target = torch.roll(tokens, -1, dims=1).to(self.device)
        self.batch_size = batch_size
        self.lr = lr
        self.bucket_bytes = bucket_bytes  # hora's sharded variants; None: the optimizer's

    def build(self):
        return small_transformer.SmallTransformer(**self.shape)

    def parameters(self):
        return sum(v.numel() for v in self.initial_state.values())


class Variant(train_variants.Variant):
    """One way of training the transformer (see
    :class:`hora.bench.train_variants.Variant`), with its own model and
    optimizer, and what it holds on this rank."""

    def step(self):
        self.optimizer.zero_grad()
        train_models.loss(self.forward(self.setup.data), self.setup.target).backward()
        self.optimizer.step()

    def forward(self, data):
        return self.model(data)

    def _model(self):
        model = self.setup.build()
        model.load_state_dict(self.setup.initial_state)
        return model.to(self.setup.device)

    def flat_weights(self):
        # FSDP2's parameters are DTensors: their full values, gathered
        with torch.no_grad():
            return torch.cat([_full(p).reshape(-1).double()
                              for p in self.model.parameters()]).cpu().numpy()

    def state_bytes(self):
        """Bytes of per-element optimizer state on this rank (Adam's moments)."""
        return sum(_local(v).numel() * v.element_size()
                   for entry in self.optimizer.state.values()
                   for key, v in entry.items() if isinstance(v, torch.Tensor) and key != "step")

    def gradient_bytes(self):
        """Bytes of gradients this rank keeps between backward and step."""
        return sum(_local(p.grad).numel() * p.grad.element_size()
                   for p in self.model.parameters() if p.grad is not None)


def _local(tensor):
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _full(tensor):
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor.detach()


class ComputeOnly(Variant):
    name, label = "compute_only", "Adam alone, no communication"
    synchronized = False

    def __init__(self, setup):
        super().__init__(setup)
        self.model = self._model()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=setup.lr)


class Hora(Variant):
    name, label = "hora", "hora DistributedOptimizer, replicated"
    sharding: str | None = None

    def __init__(self, setup):
        super().__init__(setup)
        self.model = self._model()
        options = {"model": self.model} if self.sharding == "parameters" else {}
        if self.sharding and setup.bucket_bytes is not None:
            options["bucket_bytes"] = setup.bucket_bytes
        self.optimizer = hvd.DistributedOptimizer(
            torch.optim.Adam(self.model.parameters(), lr=setup.lr),
            named_parameters=self.model.named_parameters(), sharding=self.sharding, **options)

    def flat_weights(self):
        with self.optimizer.gathered_parameters(writeback=False) if self.sharding else \
                contextlib.nullcontext():
            return super().flat_weights()

    def gradient_bytes(self):
        kept = super().gradient_bytes()
        return kept + sum(s.numel() * s.element_size()
                          for s in getattr(self.optimizer, "_hora_grad_shards", ()))


class HoraZero1(Hora):
    name, label = "hora_zero1", "hora sharding='optimizer_state' (ZeRO-1)"
    sharding = "optimizer_state"


class HoraZero2(Hora):
    name, label = "hora_zero2", "hora sharding='gradients' (ZeRO-2)"
    sharding = "gradients"


class HoraZero3(Hora):
    name, label = "hora_zero3", "hora sharding='parameters' (ZeRO-3)"
    sharding = "parameters"


_process_group: list[Any] = []  # torch.distributed, once it is started


def torch_distributed():
    """torch.distributed over gloo among the job's ranks, started once."""
    import torch.distributed as dist
    if not _process_group:
        port = hvd.broadcast_object(_free_port() if hvd.rank() == 0 else None, root_rank=0,
                                    name="bench.sharding.port")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=hvd.rank(), world_size=hvd.size())
        _process_group.append(dist)
    return _process_group[0]


def stop_torch_distributed():
    if _process_group:
        _process_group.pop().destroy_process_group()


class DdpZero(Variant):
    """``ZeroRedundancyOptimizer(Adam)`` on a DDP model, both with their
    defaults, as PyTorch's ZeRO tutorial writes it."""

    name, label = "ddp_zero", "PyTorch DDP + ZeroRedundancyOptimizer (gloo)"

    def __init__(self, setup):
        super().__init__(setup)
        torch_distributed()
        from torch.distributed.optim import ZeroRedundancyOptimizer
        self.model = self._model()
        self.ddp = torch.nn.parallel.DistributedDataParallel(self.model)
        self.optimizer = ZeroRedundancyOptimizer(self.ddp.parameters(),
                                                 optimizer_class=torch.optim.Adam, lr=setup.lr)

    def forward(self, data):
        return self.ddp(data)

    def state_bytes(self):
        return sum(v.numel() * v.element_size() for entry in self.optimizer.optim.state.values()
                   for key, v in entry.items() if isinstance(v, torch.Tensor) and key != "step")

    def gradient_bytes(self):
        # DDP's buckets hold a second copy of the gradients
        buckets = 0
        for bucket in getattr(self.ddp, "_get_ddp_logging_data", lambda: {})().get(
                "bucket_sizes", "").split(","):
            if bucket.strip():
                buckets += int(bucket)
        return super().gradient_bytes() + buckets


class Fsdp2(Variant):
    """FSDP2: ``fully_shard`` on every transformer block, then on the model
    (parameters, gradients and Adam's state sharded: ZeRO-3)."""

    name, label = "fsdp2", "PyTorch FSDP2 fully_shard (gloo)"

    def __init__(self, setup):
        super().__init__(setup)
        torch_distributed()
        from torch.distributed.fsdp import fully_shard
        self.model = self._model()
        for block in self.model.blocks:
            fully_shard(block)
        fully_shard(self.model)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=setup.lr)


KNOWN = {"ddp_zero": DdpZero, "fsdp2": Fsdp2}
HORA = {"hora": Hora, "hora_zero1": HoraZero1, "hora_zero2": HoraZero2,
        "hora_zero3": HoraZero3}
