"""Checkpoints of a sharded ``DistributedOptimizer``.

Each rank holds the optimizer state of its pieces only (1-D slices of the
parameters, see :mod:`hora.common.shard_layout`). Two ways to save it:

- **Full** (:func:`full_state_dict`, what ``optimizer.state_dict()``
  returns): torch's own format, as a plain optimizer of the same parameters
  would have it; collective, every rank ends up with the whole state. It
  loads at any world size (each rank cuts out its slice, locally) and into
  a plain torch optimizer.
- **Sharded** (:func:`sharded_state_dict`): this rank's pieces and the
  layout they were cut by; local and 1/N of the state, for models too large
  to consolidate. It loads back at the same world size, and
  :func:`consolidate_sharded_state_dicts` merges a full set into a full
  state dict offline, which then loads at any size.

A state entry of a piece is *elementwise* when it is a 1-D tensor with the
piece's number of elements (Adam's moments, momentum buffers); anything
else (Adam's ``step``, plain values) is the same on every rank owning part
of the parameter and is taken from the first of them.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Sequence
from typing import Any

import torch

from hora.common.shard_layout import ShardLayout
from hora.torch.mpi_ops import allgather
from hora.common.ops import allgather_object
from hora.torch._collectives import set_object

FORMAT = "hora-sharded-optimizer-state v1"
# State entries of a one-element parameter that are scalars, not per-element
# values (the two look alike when the parameter itself is 0-d).
_SCALAR_KEYS = frozenset({"step", "eta", "mu"})


def _elementwise(value: Any, numel: int) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() == 1 and value.numel() == numel


def _elementwise_full(key: str, value: Any, shape: tuple[int, ...]) -> bool:
    """Whether ``value`` is a per-element entry of a parameter of ``shape``."""
    if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(shape):
        return False
    return len(shape) > 0 or key not in _SCALAR_KEYS


@contextlib.contextmanager
def _state_of_parameters(optimizer: Any, state: dict[Any, Any]):
    """Makes ``optimizer.state`` the given dict (keyed by parameters) while
    torch's own ``state_dict`` / ``load_state_dict`` run, so that they number
    and pack the groups as they always do."""
    saved = optimizer.state
    optimizer.state = collections.defaultdict(dict, state)
    try:
        yield
    finally:
        optimizer.state = saved


def _base(optimizer: Any) -> Any:
    return optimizer._torch_optimizer()


def _piece_state(optimizer: Any) -> dict[int, tuple[Any, dict[str, Any]]]:
    """layout position -> (piece, its state) for this rank's pieces with state."""
    found = {}
    for piece, tensor, _, _ in optimizer._hora_pieces.values():
        state = optimizer.state.get(tensor)
        if state:
            found[piece.param] = (piece, state)
    return found


def full_state_dict(optimizer: Any) -> dict[str, Any]:
    """Collective over the optimizer's process set: the whole state in
    torch's format, on every rank."""
    if not optimizer._hora_member:
        return _base(optimizer).state_dict()
    layout: ShardLayout = optimizer._hora_layout
    process_set = optimizer._hora_process_set
    mine = _piece_state(optimizer)
    # What each rank's pieces hold: per-element entries by dtype, others by value.
    described = {}
    for position, (piece, state) in mine.items():
        described[position] = {
            key: ("elementwise", str(value.dtype)) if _elementwise(value, piece.numel)
            else ("value", value.detach().cpu().clone() if isinstance(value, torch.Tensor)
                  else value)
            for key, value in state.items()}
    everyone = allgather_object(described, name="hora.sharding.state_dict.entries",
                                process_set=set_object(process_set))
    entries: dict[int, dict[str, Any]] = {}
    for ranks_entries in everyone:
        for position, keys in ranks_entries.items():
            merged = entries.setdefault(position, {})
            for key, spec in keys.items():
                merged.setdefault(key, spec)
    params = optimizer._hora_params
    full: dict[Any, dict[str, Any]] = {}
    for position, keys in entries.items():
        p = params[position]
        full[p] = {key: (spec[1].to(p.device) if isinstance(spec[1], torch.Tensor)
                         and spec[1].dim() > 0 else spec[1])
                   for key, spec in keys.items() if spec[0] == "value"}
    # Per-element entries travel bucket by bucket, one allgather per entry.
    for b, bucket in enumerate(layout.buckets):
        dtypes: dict[str, str] = {}  # entry -> its dtype's name
        for position in bucket.members:
            for key, spec in entries.get(position, {}).items():
                if spec[0] == "elementwise":
                    dtypes.setdefault(key, spec[1])
        head = params[bucket.members[0]]
        own = layout.pieces(optimizer._hora_rank, b)
        for key in sorted(dtypes):
            dtype = getattr(torch, dtypes[key].replace("torch.", ""))
            shard = torch.zeros(layout.shard_numel(b, optimizer._hora_rank), dtype=dtype,
                                device=head.device)
            for piece in own:
                value = mine.get(piece.param, (None, {}))[1].get(key)
                if value is not None:
                    shard[piece.offset:piece.offset + piece.numel].copy_(value)
            flat = allgather(shard, name=f"hora.sharding.state_dict.{b}.{key}",
                             process_set=process_set)
            for position, offset in zip(bucket.members, bucket.offsets):
                spec = entries.get(position, {}).get(key)
                if spec is not None and spec[0] == "elementwise":
                    p = params[position]
                    shape = optimizer._hora_shapes[p]
                    full[p][key] = flat[offset:offset + layout.numels[position]].view(
                        shape).clone()
    with _state_of_parameters(optimizer, full):
        return _base(optimizer).state_dict()


def load_full_state_dict(optimizer: Any, state_dict: dict[str, Any]) -> None:
    """Local: loads a full state dict and keeps this rank's slice of it."""
    if isinstance(state_dict, dict) and FORMAT in state_dict:
        raise ValueError("load_state_dict: this is a sharded state dict (from "
                         "sharded_state_dict()); load it with load_sharded_state_dict(), or "
                         "merge a full set with consolidate_sharded_state_dicts() first")
    base = _base(optimizer)
    with _state_of_parameters(optimizer, {}):
        base.load_state_dict(state_dict)
        loaded = optimizer.state
    if not optimizer._hora_member:
        optimizer.state = loaded
        return
    sliced: dict[Any, dict[str, Any]] = collections.defaultdict(dict)
    for p, state in loaded.items():
        keep_slice(optimizer, p, state, sliced)
    optimizer.state = sliced
    # broadcast_optimizer_state() may hand this on from its root
    optimizer._hora_loaded = state_dict


def keep_slice(optimizer: Any, param: torch.Tensor, state: dict[str, Any],
               into: dict[Any, dict[str, Any]]) -> None:
    """Puts this rank's slice of ``param``'s full ``state`` into ``into``
    (keyed by the piece the wrapped optimizer steps); nothing when this
    rank owns no part of ``param``."""
    entry = optimizer._hora_pieces.get(param)
    if entry is None:
        return
    piece, tensor, _, _ = entry
    into[tensor] = {key: value.reshape(-1)[piece.start:piece.stop].clone()
                    if _elementwise_full(key, value, optimizer._hora_shapes[param]) else value
                    for key, value in state.items()}


def numbering(optimizer: Any) -> dict[Any, int]:
    """Parameter -> its number in torch's state dicts (position over all
    groups, as ``Optimizer.state_dict`` numbers them)."""
    numbers: dict[Any, int] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            numbers.setdefault(p, len(numbers))
    return numbers


def sharded_state_dict(optimizer: Any) -> dict[str, Any]:
    """Local: this rank's pieces' state (keyed by the parameters' numbers,
    as torch numbers them) with the layout and where each piece lies."""
    layout: ShardLayout = optimizer._hora_layout
    params = optimizer._hora_params
    state = {params[position]: dict(entry) for position, (_, entry)
             in _piece_state(optimizer).items()}
    with _state_of_parameters(optimizer, state):
        result = _base(optimizer).state_dict()
    numbers = numbering(optimizer)
    result[FORMAT] = {
        "rank": optimizer._hora_rank,
        "size": layout.size,
        "fingerprint": layout.fingerprint(),
        "numels": list(layout.numels),
        "units": [list(bucket.members) for bucket in layout.buckets],
        "numbers": [numbers[p] for p in params],
        "shapes": [optimizer._hora_shapes[p] for p in params],
        "pieces": {numbers[params[piece.param]]: (piece.start, piece.stop)
                   for piece in layout.pieces(optimizer._hora_rank)},
    }
    return result


def _check_shard(optimizer: Any, meta: dict[str, Any], what: str) -> None:
    layout: ShardLayout = optimizer._hora_layout
    if meta["size"] != layout.size or meta["rank"] != optimizer._hora_rank:
        raise ValueError(
            f"{what}: this shard was saved by rank {meta['rank']} of {meta['size']}, but this is "
            f"rank {optimizer._hora_rank} of {layout.size}; load the shard saved by this rank at "
            f"this world size, or merge the shards with consolidate_sharded_state_dicts() and "
            f"load the result with load_state_dict()")
    if meta["fingerprint"] != layout.fingerprint():
        raise ValueError(
            f"{what}: the shard was cut from other parameters or buckets (layout "
            f"{meta['fingerprint']}, this optimizer's {layout.fingerprint()}): the model, the "
            f"optimizer's parameter groups or bucket_bytes differ")


def load_sharded_state_dict(optimizer: Any, state_dict: dict[str, Any]) -> None:
    """Local: loads the shard :func:`sharded_state_dict` saved on this rank."""
    what = "load_sharded_state_dict"
    if not isinstance(state_dict, dict) or FORMAT not in state_dict:
        raise ValueError(f"{what}: not a sharded state dict (no '{FORMAT}' entry); a full one "
                         f"loads with load_state_dict()")
    _check_shard(optimizer, state_dict[FORMAT], what)
    plain = {k: v for k, v in state_dict.items() if k != FORMAT}
    with _state_of_parameters(optimizer, {}):
        _base(optimizer).load_state_dict(plain)
        loaded = optimizer.state
    moved: dict[Any, dict[str, Any]] = collections.defaultdict(dict)
    for p, state in loaded.items():
        if p in optimizer._hora_pieces:
            moved[optimizer._hora_pieces[p][1]] = state
    optimizer.state = moved
    optimizer._hora_loaded = None


def consolidate_sharded_state_dicts(shards: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Merges the sharded state dicts of every rank of one save (any order)
    into one full state dict, offline (no hora job needed); it loads with
    ``load_state_dict`` at any world size."""
    if not shards:
        raise ValueError("consolidate_sharded_state_dicts: no shards given")
    metas = []
    for i, shard in enumerate(shards):
        if not isinstance(shard, dict) or FORMAT not in shard:
            raise ValueError(f"consolidate_sharded_state_dicts: entry {i} is not a sharded "
                             f"state dict")
        metas.append(shard[FORMAT])
    size, fingerprint = metas[0]["size"], metas[0]["fingerprint"]
    for meta in metas:
        if meta["size"] != size or meta["fingerprint"] != fingerprint:
            raise ValueError(
                f"consolidate_sharded_state_dicts: the shards come from different saves (rank "
                f"{meta['rank']} of {meta['size']}, layout {meta['fingerprint']}; rank "
                f"{metas[0]['rank']} of {size}, layout {fingerprint})")
    ranks = sorted(meta["rank"] for meta in metas)
    if ranks != list(range(size)):
        missing = sorted(set(range(size)) - set(ranks))
        raise ValueError(f"consolidate_sharded_state_dicts: a save of {size} ranks needs every "
                         f"rank's shard once; missing ranks {missing}, given {ranks}")
    ordered = sorted(shards, key=lambda shard: shard[FORMAT]["rank"])
    head = ordered[0][FORMAT]
    shapes = {number: tuple(shape) for number, shape in zip(head["numbers"], head["shapes"])}
    state: dict[int, dict[str, Any]] = {}
    for shard in ordered:
        pieces = shard[FORMAT]["pieces"]
        for number, entry in shard["state"].items():
            start, stop = pieces[number]
            merged = state.setdefault(number, {})
            for key, value in entry.items():
                if not _elementwise(value, stop - start):
                    merged.setdefault(key, value)
                    continue
                if key not in merged:
                    merged[key] = torch.zeros(shapes[number], dtype=value.dtype,
                                              device=value.device)
                merged[key].view(-1)[start:stop].copy_(value)
    return {"state": state, "param_groups": ordered[0]["param_groups"]}
