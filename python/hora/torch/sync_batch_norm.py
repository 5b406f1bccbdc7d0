"""Batch normalization with statistics over the batches of all ranks (or of
the ranks of a process set)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from hora.torch._collectives import (
    ProcessSet, Sum, allgather_now, allreduce_now, global_process_set, set_id)


def _reduce_dims(x):
    return [0] + list(range(2, x.dim()))


def _per_channel(t, x):
    return t.reshape((1, -1) + (1,) * (x.dim() - 2))


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, ident):
        channels = x.shape[1]
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        xw = x.to(work)
        dims = _reduce_dims(x)
        count = x.numel() // channels if channels else 0
        if count > 0:
            local_mean = xw.mean(dim=dims)
            local_m2 = (xw - _per_channel(local_mean, x)).square().sum(dim=dims)
        else:
            local_mean = torch.zeros(channels, dtype=work, device=x.device)
            local_m2 = torch.zeros(channels, dtype=work, device=x.device)
        stats = torch.cat([torch.tensor([float(count)], dtype=work, device=x.device), local_mean,
                           local_m2])
        gathered = allgather_now(stats.unsqueeze(0), process_set=ident)
        counts = gathered[:, :1]
        means = gathered[:, 1:1 + channels]
        m2s = gathered[:, 1 + channels:]
        total = float(counts.sum())
        if total <= 1:
            raise ValueError(f"SyncBatchNorm: expected more than 1 value per channel over all "
                             f"ranks when training, got {int(total)}")
        # Chan et al.'s parallel combination of the per-rank mean and M2
        mean = (counts * means).sum(dim=0) / total
        m2 = m2s.sum(dim=0) + (counts * (means - mean).square()).sum(dim=0)
        var = m2 / total
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_((mean * momentum).to(running_mean.dtype))
        if running_var is not None:
            with torch.no_grad():
                unbiased = m2 / (total - 1)
                running_var.mul_(1 - momentum).add_((unbiased * momentum).to(running_var.dtype))
        xhat = (xw - _per_channel(mean, x)) * _per_channel(invstd, x)
        y = xhat
        if weight is not None:
            y = y * _per_channel(weight.to(work), x)
        if bias is not None:
            y = y + _per_channel(bias.to(work), x)
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.total = total
        ctx.has_bias = bias is not None
        ctx.process_set = ident
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        xhat, invstd, weight = ctx.saved_tensors
        g = grad.to(xhat.dtype)
        dims = _reduce_dims(xhat)
        sum_g = g.sum(dim=dims)
        sum_g_xhat = (g * xhat).sum(dim=dims)
        grad_x = None
        if ctx.needs_input_grad[0]:
            # the statistics depend on every rank's input, so the input's
            # gradient needs the sums over all ranks
            channels = sum_g.shape[0]
            totals = allreduce_now(torch.cat([sum_g, sum_g_xhat]), Sum,
                                   process_set=ctx.process_set)
            mean_g = totals[:channels] / ctx.total
            mean_g_xhat = totals[channels:] / ctx.total
            scale = invstd if weight is None else invstd * weight.to(invstd.dtype)
            grad_x = (_per_channel(scale, xhat)
                      * (g - _per_channel(mean_g, xhat) - xhat * _per_channel(mean_g_xhat, xhat)))
            grad_x = grad_x.to(grad.dtype)
        grad_weight = sum_g_xhat.to(weight.dtype) if weight is not None else None
        grad_bias = sum_g.to(weight.dtype if weight is not None else grad.dtype) \
            if ctx.has_bias else None
        return grad_x, grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalization whose training statistics are those of the global
    batch: the concatenation of every rank's batch, whatever each rank's
    batch size (a rank may even have none). Forward and backward match
    ``torch.nn.BatchNorm{1,2,3}d`` applied to the concatenated batch; the
    weight and bias gradients are this rank's share (the optimizer's
    reduction combines them). In eval mode with running statistics it
    normalizes locally, exactly as BatchNorm does.

    Arguments and defaults are BatchNorm's: ``num_features``, ``eps=1e-5``,
    ``momentum=0.1`` (None: cumulative average), ``affine=True``,
    ``track_running_stats=True``. Takes input of shape ``(N, C, ...)``;
    fewer than 2 dimensions raise ``ValueError``, as do input on a device
    other than CPU or CUDA and a global batch with a single value per
    channel in training. Training-mode forward and backward are collectives:
    every rank must run them.

    ``process_set`` (a :class:`hora.ProcessSet`, default every rank) takes
    the statistics over the batches of that set's ranks only, which alone
    run the module in training mode (another rank gets ``ValueError``).
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None,
                 process_set: ProcessSet = global_process_set) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype)
        set_id(process_set, "SyncBatchNorm")
        self.process_set = global_process_set if process_set is None else process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm: expected an input with at least 2 dimensions "
                             f"(N, C, ...), got {input.dim()}")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalizes ``input`` (see the class docstring)."""
        self._check_input_dim(input)
        if input.device.type not in ("cpu", "cuda"):
            raise ValueError(f"SyncBatchNorm: the input is on device '{input.device}'; "
                             f"hora.torch handles CPU and CUDA tensors")
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                      else self.momentum)
        use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        if not use_batch_stats:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                                False, 0.0, self.eps)
        update = self.training and self.track_running_stats
        return _SyncBatchNormFunction.apply(
            input, self.weight, self.bias, self.running_mean if update else None,
            self.running_var if update else None, self.eps, factor,
            set_id(self.process_set, "SyncBatchNorm"))

    @classmethod
    def convert_sync_batchnorm(cls, module: torch.nn.Module,
                               process_set: ProcessSet = global_process_set) -> torch.nn.Module:
        """Returns ``module`` with every ``torch.nn.BatchNorm*d`` inside it (or
        itself) replaced by a :class:`SyncBatchNorm` holding the same
        parameters and running statistics, synchronized over ``process_set``."""
        result = module
        if isinstance(module, _BatchNorm) and not isinstance(module, cls):
            result = cls(module.num_features, module.eps, module.momentum, module.affine,
                         module.track_running_stats, process_set=process_set)
            if module.affine:
                with torch.no_grad():
                    result.weight = module.weight
                    result.bias = module.bias
            result.running_mean = module.running_mean
            result.running_var = module.running_var
            result.num_batches_tracked = module.num_batches_tracked
            result.training = module.training
        for name, child in module.named_children():
            result.add_module(name, cls.convert_sync_batchnorm(child, process_set))
        return result
