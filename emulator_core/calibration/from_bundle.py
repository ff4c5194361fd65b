"""The message sizes a recorded job's collectives move, for ``nbox calibrate --sizes-from BUNDLE``.

A calibration measures each collective at a grid of sizes and the fit interpolates between them. Where the
fabric's time is not smooth in the size, the grid misses what the job pays: over a shaped link gloo's
all-gather runs in one of two modes, and which one a grid point's median lands on varies from point to point
(docs/results.md, "FSDP2's all-gathers and the job's own sizes"). Measuring the sizes the job itself
issues prices its calls from their own points. Sizes are ``comm_size`` as recorded, the convention ``--sizes``
uses (the per-rank input; all_gather: the shard).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

from emulator_core.calibration.spec import MAX_SIZE, CalibrateUsageError
from nbox_trace.bundle import load_bundle
from nbox_trace.contract import comm_type_name

#: At most this many sizes come from one bundle, those moving the most bytes in all: each size adds a point per
#: collective measured, and a large point takes seconds.
MAX_JOB_SIZES = 12
#: A size within this share of one already taken (which moves more bytes) is left to it: the fit interpolates the
#: few percent between them, and near-equal points only give one noisy median more say in the curve (the fit makes
#: the medians non-decreasing in size by pooling neighbours).
NEAR_SHARE = 0.10


@dataclass(frozen=True)
class JobSizes:
    """What :func:`job_sizes` found: the sizes to add (sorted) and what it left out, in words."""

    sizes: tuple[int, ...]
    notes: tuple[str, ...]


def job_sizes(bundle: str | os.PathLike[str], collectives: tuple[str, ...],
              limit: int = MAX_JOB_SIZES) -> JobSizes:
    """The distinct per-rank sizes of the bundle's collectives whose type is in ``collectives`` (calibrate's
    names: ``all_reduce``, ``all_gather``, ...), over every rank it holds: the ``limit`` moving the most bytes, each
    more than :data:`NEAR_SHARE` away from those moving more.

    Raises:
        InputNotFoundError / InvalidInputError: not a readable bundle (the message names it).
        CalibrateUsageError: none of its collectives is of a type measured (names the flag and the types found).
    """
    _, report = load_bundle(bundle)
    moved: Counter[int] = Counter()
    found: set[str] = set()
    for rank in report.ranks:
        for ops in rank.coll_seq.values():
            for op in ops:
                name = comm_type_name(op.comm_type).lower()
                found.add(name)
                if name in collectives and op.size > 0:
                    moved[op.size] += op.size
    notes = []
    too_big = sorted(s for s in moved if s > MAX_SIZE)
    for s in too_big:
        del moved[s]
    if too_big:
        notes.append(f"{len(too_big)} size(s) above 4 GiB left out (the largest calibrate measures)")
    if not moved:
        raise CalibrateUsageError(f"--sizes-from {os.fspath(bundle)}: no {'/'.join(collectives)} collective of a "
                                  f"size to measure in it (its collectives: {', '.join(sorted(found)) or 'none'})")
    kept: list[int] = []
    near = 0
    for size, _ in moved.most_common():
        if any(abs(size - k) <= NEAR_SHARE * k for k in kept):
            near += 1
        elif len(kept) < limit:
            kept.append(size)
    if near:
        notes.append(f"{near} size(s) within {NEAR_SHARE:.0%} of a size taken left to it")
    if len(moved) - near > limit:
        notes.append(f"{len(moved) - near - limit} smaller-volume size(s) left out (at most {limit})")
    return JobSizes(tuple(sorted(kept)), tuple(notes))


__all__ = ["MAX_JOB_SIZES", "NEAR_SHARE", "JobSizes", "job_sizes"]
