"""Which elements of which parameter each rank owns when training state is
sharded (``DistributedOptimizer(..., sharding=...)``).

The parameters are packed into flat buckets (the same buckets the
replicated optimizer reduces, see
:func:`hora.common.gradient_policy.bucket_units`): a bucket is its members'
elements laid end to end in the bucket's order, each member row-major.
Every bucket is split among the ranks the way a reducescatter splits its
rows, so that one reducescatter of the flat bucket hands every rank exactly
its shard: ``numel // size`` elements each, the first ``numel % size`` ranks
one more. Shards are therefore balanced by elements (and bytes, since a
bucket holds one dtype) to within one element, whatever the sizes of the
parameters; a parameter may be cut between two ranks.

The optimizer, checkpointing and elastic re-sharding all read this one
object; nothing else derives ownership. It is framework-free arithmetic, so
that a checkpoint written at one world size can be re-cut for another.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Piece:
    """The part of one parameter that one rank owns."""

    param: int   # the parameter's position in the layout's parameter list
    bucket: int  # the bucket it lies in
    start: int   # first owned element of the parameter (flat, row-major)
    stop: int    # one past the last
    offset: int  # where ``start`` sits in the rank's shard of the bucket

    @property
    def numel(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Bucket:
    """Parameters laid end to end in one flat buffer."""

    members: tuple[int, ...]  # parameter positions, in the bucket's order
    offsets: tuple[int, ...]  # where each member starts in the flat buffer
    numel: int                # elements of the whole bucket


def shard_bounds(numel: int, size: int, rank: int) -> tuple[int, int]:
    """``[start, stop)`` of the flat elements ``rank`` of ``size`` owns in a
    bucket of ``numel`` elements: reducescatter's split of rows."""
    base, extra = divmod(numel, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


class ShardLayout:
    """Buckets of parameters and each rank's share of them.

    Args:
        numels: the number of elements of each parameter, in a fixed order
            (the optimizer's).
        units: the buckets, as lists of positions into ``numels`` (every
            position in exactly one bucket).
        size: how many ranks share the buckets.
    """

    def __init__(self, numels: Sequence[int], units: Sequence[Sequence[int]], size: int):
        if size < 1:
            raise ValueError(f"a shard layout needs at least one rank, got {size}")
        self.numels = tuple(int(n) for n in numels)
        self.size = size
        seen: set[int] = set()
        buckets = []
        for unit in units:
            offsets, total = [], 0
            for position in unit:
                if position in seen or not 0 <= position < len(self.numels):
                    raise ValueError(f"parameter position {position} is out of range or in two "
                                     f"buckets")
                seen.add(position)
                offsets.append(total)
                total += self.numels[position]
            buckets.append(Bucket(tuple(unit), tuple(offsets), total))
        if len(seen) != len(self.numels):
            missing = sorted(set(range(len(self.numels))) - seen)
            raise ValueError(f"parameters {missing[:10]} are in no bucket")
        self.buckets = tuple(buckets)
        self.bucket_of = {p: b for b, bucket in enumerate(buckets) for p in bucket.members}
        # where each parameter starts in its bucket's flat buffer
        self.offset_of = {p: offset for bucket in buckets
                          for p, offset in zip(bucket.members, bucket.offsets)}

    def bounds(self, bucket: int, rank: int) -> tuple[int, int]:
        """``[start, stop)`` of ``rank``'s shard in the flat ``bucket``."""
        return shard_bounds(self.buckets[bucket].numel, self.size, rank)

    def shard_numel(self, bucket: int, rank: int) -> int:
        start, stop = self.bounds(bucket, rank)
        return stop - start

    def pieces(self, rank: int, bucket: int | None = None) -> list[Piece]:
        """The pieces ``rank`` owns, bucket by bucket in the buckets' order
        (or of one bucket), each bucket's in its members' order. A
        parameter has at most one piece on a rank."""
        chosen = range(len(self.buckets)) if bucket is None else [bucket]
        pieces = []
        for b in chosen:
            start, stop = self.bounds(b, rank)
            entry = self.buckets[b]
            for position, offset in zip(entry.members, entry.offsets):
                lo = max(start, offset)
                hi = min(stop, offset + self.numels[position])
                if lo < hi:
                    pieces.append(Piece(position, b, lo - offset, hi - offset, lo - start))
        return pieces

    def owners(self, param: int) -> list[tuple[int, int, int]]:
        """``(rank, start, stop)`` of every rank owning part of parameter
        ``param``, in rank order; the ranges cover the parameter."""
        b = self.bucket_of[param]
        offset = self.offset_of[param]
        owners = []
        for rank in range(self.size):
            start, stop = self.bounds(b, rank)
            lo = max(start, offset)
            hi = min(stop, offset + self.numels[param])
            if lo < hi:
                owners.append((rank, lo - offset, hi - offset))
        return owners

    def fingerprint(self) -> str:
        """A short digest of the parameters' sizes and the buckets: equal
        for two layouts that cut the same parameters into the same buckets
        (whatever the number of ranks)."""
        text = repr((self.numels, [bucket.members for bucket in self.buckets]))
        return hashlib.sha256(text.encode()).hexdigest()[:16]
