"""Elastic training for PyTorch, Horovod's ``horovod.torch.elastic``:
``hvd.elastic.run``, ``TorchState`` (model, optimizer, samplers and any
picklable attributes) and ``ElasticSampler``. See ``docs/elastic.md``."""

from hora.common.elastic import ObjectState, State, run
from hora.common.exceptions import HorovodInternalError, HoraInternalError, HostsUpdatedInterrupt
from hora.torch.elastic.sampler import ElasticSampler
from hora.torch.elastic.state import TorchState

__all__ = ["ElasticSampler", "HoraInternalError", "HorovodInternalError",
           "HostsUpdatedInterrupt", "ObjectState", "State", "TorchState", "run"]
