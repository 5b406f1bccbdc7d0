"""The ways ``python -m hora.bench torch-synthetic`` trains one model: hora's
DistributedOptimizer, the same step with no communication, PyTorch's
DistributedDataParallel (gloo on CPU, NCCL on CUDA) and Horovod's
DistributedOptimizer. Each owns a copy of the model (the same initial
weights everywhere) and its optimizer."""

from __future__ import annotations

import os

import torch

import hora.torch as hvd
from hora.bench import train_models
from hora.bench.implementations import _free_port


class Variant:
    """One way of training (see :mod:`hora.bench.synthetic`); ``step()``
    trains one batch."""

    name = ""
    label = ""
    reason = None
    background = False
    synchronized = True  # whether its ranks agree on the parameters

    def __init__(self, setup):
        self.setup = setup
        self.sent_per_batch = []  # bytes this rank's host sent per batch (--count-bytes)

    def start(self):
        pass

    def stop(self):
        pass

    def run(self, batches):
        for _ in range(batches):
            self.step()
        if self.setup.device.type == "cuda":
            torch.cuda.synchronize(self.setup.device)

    def flat_weights(self):
        with torch.no_grad():
            return torch.cat([p.detach().reshape(-1).double().cpu()
                              for p in self.model.parameters()]).numpy()

    def _model(self, norm=None):
        torch.manual_seed(0)
        model = train_models.build(self.setup.model, norm)
        model.load_state_dict(self.setup.initial_state)
        return model.to(self.setup.device)

    def _compiled(self, model):
        """``model`` through ``torch.compile`` under ``--compile``."""
        return torch.compile(model)

    def _make_step(self, model, optimizer):
        data, target = self.setup.data, self.setup.target
        forward = self._compiled(model) if getattr(self.setup.args, "compile", False) else model

        def step():
            optimizer.zero_grad()
            train_models.loss(forward(data), target).backward()
            optimizer.step()
        self.model = model
        self.step = step


class Hora(Variant):
    name, label = "hora", "hora DistributedOptimizer"
    bucket_bytes: int | None = None  # HORA_GRADIENT_BUCKET_BYTES, 25 MiB by default

    def __init__(self, setup):
        super().__init__(setup)
        args = setup.args
        model = self._model(hvd.SyncBatchNorm if args.sync_batch_norm else None)
        optimizer = torch.optim.SGD(model.parameters(), lr=setup.lr)
        optimizer = hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(), compression=self._compression(),
            op=hvd.Average, groups=args.groups or None, bucket_bytes=self.bucket_bytes)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        self._make_step(model, optimizer)

    def _compression(self):
        return hvd.Compression.fp16 if self.setup.args.fp16_allreduce else hvd.Compression.none

    def _compiled(self, model):
        # the graph cut at the buckets' ends, so that allreduces overlap the backward
        return hvd.compile(model, bucket_bytes=self.bucket_bytes)


class HoraWholeGraph(Hora):
    """hora under plain ``torch.compile``: one compiled backward, so every
    bucket's allreduce starts after it (the same as hora with --compile
    when not compiling)."""

    name, label = "hora_whole_graph", "hora, plain torch.compile (no overlap with backward)"

    def _compiled(self, model):
        return torch.compile(model)


class HoraFp16(Hora):
    name, label = "hora_fp16", "hora, gradients sent as float16 (Compression.fp16)"

    def _compression(self):
        return hvd.Compression.fp16


# PowerSGD and one-bit start after the uncompressed steps DDP's PowerSGD hook
# needs (2), which the warm-up batches cover
COMPRESSION_START = 2


def _hora_powersgd(rank):
    class HoraPowerSGD(Hora):
        name, label = f"hora_powersgd{rank}", f"hora, Compression.powersgd(rank={rank})"

        def _compression(self):
            return hvd.Compression.powersgd(rank=rank, start_iter=COMPRESSION_START)
    return HoraPowerSGD


class HoraOneBit(Hora):
    name, label = "hora_onebit", "hora, Compression.onebit() (signs and a scale)"

    def _compression(self):
        return hvd.Compression.onebit(start_iter=COMPRESSION_START)


def _hora_local(steps):
    class HoraLocalSGD(Hora):
        name, label = f"hora_local{steps}", f"hora, local SGD (local_steps={steps})"
        # the ranks differ between averagings
        synchronized = False

        def __init__(self, setup):
            Variant.__init__(self, setup)
            model = self._model()
            optimizer = hvd.DistributedOptimizer(
                torch.optim.SGD(model.parameters(), lr=setup.lr),
                named_parameters=model.named_parameters(), local_steps=steps)
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            self._make_step(model, optimizer)
    return HoraLocalSGD


class HoraPerGradient(Hora):
    """hora as before gradient buckets (and as Horovod reduces): one
    allreduce per gradient, submitted from its hook."""

    name, label = "hora_per_gradient", "hora, one allreduce per gradient (bucket_bytes=0)"
    bucket_bytes = 0


class ComputeOnly(Variant):
    name, label = "compute_only", "compute only (no communication)"
    synchronized = False

    def __init__(self, setup):
        super().__init__(setup)
        model = self._model()
        self._make_step(model, torch.optim.SGD(model.parameters(), lr=setup.lr))


class Ddp(Variant):
    """torch.nn.parallel.DistributedDataParallel with its defaults (25 MB
    buckets, a 1 MB first bucket, rebuilt in ready order after the first
    iteration), as a new user would write it."""

    name, label = "ddp", "PyTorch DDP"

    def __init__(self, setup):
        super().__init__(setup)
        import torch.distributed as dist
        self.dist = dist
        rank, size = hvd.rank(), hvd.size()
        port = hvd.broadcast_object(_free_port() if rank == 0 else None, root_rank=0,
                                    name="bench.ddp.port")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(port)
        self.backend = "nccl" if setup.device.type == "cuda" else "gloo"
        if Ddp._users == 0:
            dist.init_process_group(self.backend, rank=rank, world_size=size)
        Ddp._users += 1
        model = self._model()
        extra = {} if self.bucket_cap_mb is None else {"bucket_cap_mb": self.bucket_cap_mb}
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[setup.device.index] if setup.device.type == "cuda" else None,
            **extra)
        self._hook(ddp)
        self.label = self.label.replace("DDP", f"DDP ({self.backend})", 1)
        self._make_step(ddp, torch.optim.SGD(ddp.parameters(), lr=setup.lr))
        self.model = model

    _users = 0  # DDP variants sharing the process group
    bucket_cap_mb: float | None = None  # DDP's default (25)

    def _hook(self, ddp):
        if self.setup.args.fp16_allreduce:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)

    def stop(self):
        # joins gloo's threads before interpreter exit, once the last DDP
        # variant is done with the group
        Ddp._users -= 1
        if Ddp._users == 0:
            self.dist.destroy_process_group()


def _ddp_powersgd(rank):
    class DdpPowerSGD(Ddp):
        name, label = f"ddp_powersgd{rank}", f"PyTorch DDP, PowerSGD hook (rank {rank})"
        # one bucket: with several, the hook issues a bucket's second
        # allreduce from gloo's callback thread while the main thread issues
        # the next bucket's first, in an order that differs between ranks,
        # and gloo pairs mismatched collectives ("Received data size doesn't
        # match expected size")
        bucket_cap_mb = 1024

        def _hook(self, ddp):
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
            state = powerSGD_hook.PowerSGDState(
                process_group=None, matrix_approximation_rank=rank,
                start_powerSGD_iter=COMPRESSION_START)
            ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return DdpPowerSGD


class Horovod(Variant):
    name, label = "horovod", "Horovod DistributedOptimizer"
    background = True

    def __init__(self, setup):
        super().__init__(setup)
        try:
            import horovod.torch as horovod
        except ImportError:
            self.reason = "horovod is not installed (bash scripts/install_horovod.sh builds it)"
            return
        self.horovod = horovod

    def start(self):
        horovod, args = self.horovod, self.setup.args
        horovod.init()
        model = self._model()
        optimizer = torch.optim.SGD(model.parameters(), lr=self.setup.lr)
        compression = (horovod.Compression.fp16 if args.fp16_allreduce
                       else horovod.Compression.none)
        optimizer = horovod.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(), compression=compression,
            op=horovod.Average, groups=args.groups or None)
        self._make_step(model, optimizer)

    def stop(self):
        self.horovod.shutdown()


KNOWN = {"ddp": Ddp, "horovod": Horovod, "hora_per_gradient": HoraPerGradient,
         "hora_whole_graph": HoraWholeGraph, "hora_fp16": HoraFp16,
         **{f"hora_powersgd{r}": _hora_powersgd(r) for r in (1, 2, 4)},
         **{f"ddp_powersgd{r}": _ddp_powersgd(r) for r in (1, 2, 4)},
         **{f"hora_local{h}": _hora_local(h) for h in (4, 16)}, "hora_onebit": HoraOneBit}
