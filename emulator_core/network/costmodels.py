"""Closed-form alpha-beta cost models for collectives: modeled time in microseconds, O(1) in world size.

A rank reaches its peers through one :class:`Link`: a message of ``m`` bytes costs ``alpha + m * beta``
microseconds, ``alpha = Link.latency_us``, ``beta = 1 / (Link.bandwidth_bytes_per_us * e(size))``, ``e`` the link's
:class:`Efficiency` curve (default 1.0) at the collective's nccl-tests "size" (below). Links are full duplex; the
reduction arithmetic is folded into the calibrated bandwidth. ``p`` is the number of ranks in the group; **p == 1
costs 0 for every collective**. Units: bytes, microseconds; ``bandwidth_bytes_per_us`` = 1e6 bytes/s, so 1 GB/s
(1e9 bytes/s, decimal, as nccl-tests reports) = 1000 bytes/us (:meth:`Link.from_gbps`).

What ``nbytes`` means per collective (nbox / ASTRA-sim convention: the per-rank INPUT buffer):

================  ==========================================  ===================================
collective        ``nbytes`` is                               nccl-tests "size" (efficiency, algbw)
================  ==========================================  ===================================
all_reduce        the buffer (input = output = n)             n
reduce_scatter    the full per-rank input (output n/p)        n
all_gather        the per-rank input shard (output p*n)       p*n
all_to_all(_v)    the whole per-rank send buffer (n/p a peer) n
broadcast         the buffer at the root                      n
reduce            the per-rank input (= the root's output)    n
gather            each rank's contribution (root gets p*n)    p*n
scatter           each rank's piece (root's input is p*n)     p*n
barrier           ignored (no data)                           0
send_recv         the message                                 n
================  ==========================================  ===================================

So ring all-reduce(n) = ring reduce-scatter(n) + ring all-gather(n/p), exactly. "direct" algorithms assume a
rank's ``p - 1`` messages proceed at once, sharing its injection bandwidth and paying the latency once; ``auto``
(``pricing.make_pricer``) chooses among NCCL's set (:data:`NCCL_ALGORITHMS`: ring and double binary tree) where a
collective has them. The formulas' sources, and why ``direct`` is not in ``auto``'s set: docs/design/network-model.md.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = [
    "BYTES_PER_US_PER_GBPS",
    "COST_MODELS",
    "NCCL_ALGORITHMS",
    "Efficiency",
    "Link",
    "algorithms_for",
    "check_finite",
    "collectives",
    "cost",
    "hierarchical_all_reduce",
]

#: 1 GB/s (1e9 bytes per second) in bytes per microsecond.
BYTES_PER_US_PER_GBPS = 1e3


def check_finite(name: str, value: float) -> float:
    """``value`` as a float; ``ValueError`` naming ``name`` unless it is a finite int or float (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Efficiency:
    """Fraction of nominal bandwidth achieved, as a function of message size (bytes).

    ``points`` are ``(size_bytes, fraction)`` pairs with strictly increasing ``size_bytes > 0`` and
    ``0 < fraction <= 1``. Between points the fraction is linear in ``log(size)``; below the first point it
    is the first fraction, above the last the last one. No points (the default) means 1.0 everywhere.
    Applied by dividing the beta term's bandwidth: ``beta = 1 / (bandwidth * e(size))``. A calibrated
    curve that rises steeply with size can make modeled time dip with size; that is the data speaking.
    """

    points: tuple[tuple[int, float], ...] = ()
    _log_sizes: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        previous = 0
        for i, point in enumerate(self.points):
            if not isinstance(point, tuple) or len(point) != 2:
                raise ValueError(f"efficiency point {i} must be (size_bytes, fraction), got {point!r}")
            size, fraction = point
            if isinstance(size, bool) or not isinstance(size, int) or size <= previous:
                raise ValueError(
                    f"efficiency point {i}: size_bytes must be an int > {previous} (strictly increasing), got {size!r}"
                )
            frac = check_finite(f"efficiency point {i} fraction", fraction)
            if not 0.0 < frac <= 1.0:
                raise ValueError(f"efficiency point {i}: fraction must be in (0, 1], got {fraction!r}")
            previous = size
        object.__setattr__(self, "_log_sizes", tuple(math.log(s) for s, _ in self.points))

    def __call__(self, nbytes: float) -> float:
        """The fraction (0 < e <= 1) of nominal bandwidth at ``nbytes`` bytes."""
        pts = self.points
        if not pts:
            return 1.0
        if nbytes <= pts[0][0]:
            return pts[0][1]
        if nbytes >= pts[-1][0]:
            return pts[-1][1]
        x = math.log(nbytes)
        i = bisect.bisect_right(self._log_sizes, x)  # pts[i-1] <= nbytes < pts[i]
        x0, x1 = self._log_sizes[i - 1], self._log_sizes[i]
        e0, e1 = pts[i - 1][1], pts[i][1]
        return e0 + (e1 - e0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class Link:
    """One rank's link to its peers: latency ``alpha`` (microseconds), bandwidth (bytes per microsecond).

    ``bandwidth_bytes_per_us`` is per direction (full duplex); 1 GB/s = 1e9 bytes/s = 1000 bytes/us.
    ``efficiency`` scales the bandwidth per message size (see :class:`Efficiency`).
    """

    latency_us: float
    bandwidth_bytes_per_us: float
    efficiency: Efficiency = Efficiency()

    def __post_init__(self) -> None:
        if check_finite("latency_us", self.latency_us) < 0:
            raise ValueError(f"latency_us must be >= 0, got {self.latency_us!r}")
        if check_finite("bandwidth_bytes_per_us", self.bandwidth_bytes_per_us) <= 0:
            raise ValueError(f"bandwidth_bytes_per_us must be > 0, got {self.bandwidth_bytes_per_us!r}")
        if not isinstance(self.efficiency, Efficiency):
            raise ValueError(f"efficiency must be an Efficiency, got {self.efficiency!r}")

    @classmethod
    def from_gbps(cls, latency_us: float, bandwidth_gbps: float, efficiency: Efficiency | None = None) -> Link:
        """A link from a bandwidth in GB/s (1e9 bytes per second, not GiB/s, not Gbit/s)."""
        bw = check_finite("bandwidth_gbps", bandwidth_gbps) * BYTES_PER_US_PER_GBPS
        return cls(latency_us, bw, efficiency if efficiency is not None else Efficiency())

    @property
    def alpha(self) -> float:
        """Per-message latency, microseconds."""
        return self.latency_us

    def beta(self, size_bytes: float) -> float:
        """Microseconds per byte for a collective of nccl-tests size ``size_bytes`` (efficiency applied)."""
        return 1.0 / (self.bandwidth_bytes_per_us * self.efficiency(size_bytes))


def _check(nbytes: float, p: int, link: Link) -> float:
    n = check_finite("nbytes", nbytes)
    if n < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ValueError(f"p (ranks in the group) must be an int >= 1, got {p!r}")
    if not isinstance(link, Link):
        raise ValueError(f"link must be a Link, got {link!r}")
    return n


def _ceil_log2(p: int) -> int:
    """ceil(log2 p) for an int p >= 1, exact (no float rounding)."""
    return (p - 1).bit_length()


def _floor_log2(p: int) -> int:
    return p.bit_length() - 1


def _is_pow2(p: int) -> bool:
    return p & (p - 1) == 0


# ---------------------------------------------------------------------------------------------- all-reduce


def all_reduce_ring(nbytes: float, p: int, link: Link) -> float:
    """Ring all-reduce: ``2(p-1)·alpha + 2(p-1)/p · n·beta`` (reduce-scatter then all-gather around a ring).

    Source: Thakur, Rabenseifner & Gropp 2005 §4 (ring); NCCL's ring all-reduce (2(p-1) steps).
    """
    n = _check(nbytes, p, link)
    if p == 1:
        return 0.0
    return 2 * (p - 1) * link.alpha + 2 * (p - 1) / p * n * link.beta(n)


def all_reduce_double_binary_tree(nbytes: float, p: int, link: Link) -> float:
    """Double-binary-tree all-reduce, pipelined: ``2·ceil(log2 p)·alpha + 2·n·beta``.

    Two complementary binary trees each carry n/2 (Sanders, Speck & Träff 2009, as in NCCL's tree
    algorithm): a reduce up both trees then a broadcast down, pipelined in the limit of many chunks. Every
    rank is interior in one tree and a leaf in the other, so each rank sends n up + n down and receives
    n + n: bandwidth term 2·n·beta (full duplex); the pipeline fill pays the tree depth up and down,
    2·ceil(log2 p)·alpha. Hence ring wins for large n, the tree for small n at large p (NCCL's tuner behavior).
    """
    n = _check(nbytes, p, link)
    if p == 1:
        return 0.0
    return 2 * _ceil_log2(p) * link.alpha + 2 * n * link.beta(n)


def all_reduce_recursive_halving_doubling(nbytes: float, p: int, link: Link) -> float:
    """Rabenseifner's all-reduce (recursive-halving reduce-scatter + recursive-doubling all-gather).

    p a power of two: ``2·log2(p)·alpha + 2(p-1)/p · n·beta``. Otherwise, with ``p' = 2^floor(log2 p)``, Thakur et
    al.'s fold: the ``p - p'`` extra ranks first exchange half their buffer with a partner (``alpha + n/2·beta``),
    ``p'`` ranks run the power-of-two algorithm, then the result is sent back whole (``alpha + n·beta``):
    ``2(log2 p' + 1)·alpha + (2(p'-1)/p' + 3/2) · n·beta``. Source: Thakur, Rabenseifner & Gropp 2005 §4.4.
    """
    n = _check(nbytes, p, link)
    if p == 1:
        return 0.0
    beta = link.beta(n)
    q = 1 << _floor_log2(p)
    t = 2 * _floor_log2(p) * link.alpha + 2 * (q - 1) / q * n * beta
    if q != p:
        t += 2 * link.alpha + 1.5 * n * beta
    return t


def all_reduce_direct(nbytes: float, p: int, link: Link) -> float:
    """Direct all-reduce: direct reduce-scatter then direct all-gather, ``2·alpha + 2(p-1)/p · n·beta``.

    Each phase sends ``p - 1`` pieces of n/p concurrently (one latency, shared injection bandwidth); see
    the module docstring for the non-blocking-fabric assumption. Source: Chan et al. 2007 (bucket/direct
    lower bound on the bandwidth term); NCCL's "one-shot/two-shot" style all-reduce on NVSwitch.
    """
    n = _check(nbytes, p, link)
    if p == 1:
        return 0.0
    return 2 * link.alpha + 2 * (p - 1) / p * n * link.beta(n)


def hierarchical_all_reduce(nbytes: float, dims: Sequence[tuple[int, Link]], inter_algorithm: str = "ring") -> float:
    """Hierarchical all-reduce over topology dimensions, innermost first: ``dims = [(p_0, L_0), ...]``.

    For each dimension but the last: ring reduce-scatter over ``p_i`` on the current size ``s`` (first
    ``s = n``), and at the end the mirror ring all-gather of the shard ``s/p_i``; then ``s = s/p_i``. The last
    dimension runs an all-reduce (``inter_algorithm``: ring, double_binary_tree, recursive_halving_doubling
    or direct) on ``n / (p_0·...·p_{k-2})``. Time is the sum of the phases (they are sequential):
    ``sum_i [RS_ring(s_i, p_i, L_i) + AG_ring(s_i/p_i, p_i, L_i)] + AR(s_last, p_last, L_last)``.
    A dimension of size 1 costs nothing, so one dimension equals the flat algorithm. O(len(dims)).
    Source: NCCL's hierarchical (intra-node reduce-scatter, inter-node all-reduce, intra-node all-gather)
    and Thakur et al. 2005 for each phase.
    """
    if not dims:
        raise ValueError("dims must name at least one (ranks, Link) dimension")
    if inter_algorithm not in _FLAT_ALL_REDUCE:
        raise ValueError(f"unknown inter_algorithm {inter_algorithm!r}; known: {', '.join(sorted(_FLAT_ALL_REDUCE))}")
    s = check_finite("nbytes", nbytes)
    total = 0.0
    for pi, li in dims[:-1]:
        _check(s, pi, li)
        total += reduce_scatter_ring(s, pi, li) + all_gather_ring(s / pi, pi, li)
        s /= pi
    p_last, l_last = dims[-1]
    return total + _FLAT_ALL_REDUCE[inter_algorithm](s, p_last, l_last)


# ------------------------------------------------------------------------------ reduce-scatter, all-gather


def reduce_scatter_ring(nbytes: float, p: int, link: Link) -> float:
    """Ring reduce-scatter of a per-rank input of n bytes: ``(p-1)·alpha + (p-1)/p · n·beta``.

    Source: Thakur, Rabenseifner & Gropp 2005 (ring / pairwise reduce-scatter); NCCL ring.
    """
    n = _check(nbytes, p, link)
    if p == 1:
        return 0.0
    return (p - 1) * link.alpha + (p - 1) / p * n * link.beta(n)


def reduce_scatter_recursive_halving_doubling(nbytes: float, p: int, link: Link) -> float:
    """Recursive-halving reduce-scatter: ``ceil(log2 p)·alpha + (p-1)/p · n·beta``.

    Exact for p a power of two (Thakur, Rabenseifner & Gropp 2005 §4.2, commutative operations); for other
    p we use the same form with ``ceil(log2 p)`` steps, the cost of the Bruck-style dissemination dual
    (Bruck et al. 1997), an approximation stated here.
    """
    n = _check(nbytes, p, link)
    if p == 1:
        return 0.0
    return _ceil_log2(p) * link.alpha + (p - 1) / p * n * link.beta(n)


def reduce_scatter_direct(nbytes: float, p: int, link: Link) -> float:
    """Direct reduce-scatter: the p-1 pieces of n/p go out concurrently, ``alpha + (p-1)/p · n·beta``."""
    n = _check(nbytes, p, link)
    if p == 1:
        return 0.0
    return link.alpha + (p - 1) / p * n * link.beta(n)


def all_gather_ring(nbytes: float, p: int, link: Link) -> float:
    """Ring all-gather of a per-rank shard of n bytes (output p·n): ``(p-1)·alpha + (p-1) · n·beta``.

    (= ``(p-1)alpha + (p-1)/p · N·beta`` with N = p·n the output.) Source: Thakur et al. 2005; NCCL ring.
    Efficiency is evaluated at the output size p·n (nccl-tests' size).
    """
    n = _check(nbytes, p, link)
    if p == 1:
        return 0.0
    return (p - 1) * link.alpha + (p - 1) * n * link.beta(p * n)


def all_gather_recursive_halving_doubling(nbytes: float, p: int, link: Link) -> float:
    """Recursive-doubling all-gather (Bruck's for non-powers of two): ``ceil(log2 p)·alpha + (p-1) · n·beta``.

    Source: Thakur, Rabenseifner & Gropp 2005 §4.1 (recursive doubling; Bruck et al. 1997 for any p).
    """
    n = _check(nbytes, p, link)
    if p == 1:
        return 0.0
    return _ceil_log2(p) * link.alpha + (p - 1) * n * link.beta(p * n)


def all_gather_direct(nbytes: float, p: int, link: Link) -> float:
    """Direct all-gather: the shard goes to p-1 peers concurrently, ``alpha + (p-1) · n·beta``."""
    n = _check(nbytes, p, link)
    if p == 1:
        return 0.0
    return link.alpha + (p - 1) * n * link.beta(p * n)


# ----------------------------------------------------------------------------------- broadcast and reduce


def _pipelined_chain(n: float, p: int, link: Link) -> float:
    """Pipelined chain with k equal chunks: ``(p-2+k)(alpha + n/k·beta)``, k chosen optimally (continuous, k >= 1).

    Minimum at ``k* = sqrt((p-2)·n·beta/alpha)``; with ``k = max(1, k*)``. For alpha = 0 the limit is ``n·beta``.
    """
    beta = link.beta(n)
    if link.alpha == 0.0:
        return n * beta if p > 1 else 0.0
    k = max(1.0, math.sqrt((p - 2) * n * beta / link.alpha))
    return (p - 2 + k) * (link.alpha + n / k * beta)


def broadcast_ring(nbytes: float, p: int, link: Link) -> float:
    """Ring broadcast as a pipelined chain: ``min over k>=1 of (p-2+k)(alpha + n/k·beta)``.

    Closed form: ``k* = max(1, sqrt((p-2)·n·beta/alpha))``, i.e. ``(sqrt((p-2)alpha) + sqrt(nbeta))²`` when k* >= 1;
    ``(p-1)(alpha + nbeta)`` when k* = 1 (e.g. p = 2). Source: pipelined chain broadcast (Chan et al. 2007;
    Sanders, Speck & Träff 2009 §2); NCCL's ring broadcast (chunked chain) with the optimal chunk count.
    """
    n = _check(nbytes, p, link)
    if p == 1:
        return 0.0
    return _pipelined_chain(n, p, link)


def broadcast_binomial_tree(nbytes: float, p: int, link: Link) -> float:
    """Binomial-tree broadcast: ``ceil(log2 p) · (alpha + n·beta)``. Source: Thakur et al. 2005 §3."""
    n = _check(nbytes, p, link)
    if p == 1:
        return 0.0
    return _ceil_log2(p) * (link.alpha + n * link.beta(n))


def reduce_ring(nbytes: float, p: int, link: Link) -> float:
    """Ring reduce as a pipelined chain (mirror of :func:`broadcast_ring`): same formula, gamma not modeled."""
    return broadcast_ring(nbytes, p, link)


def reduce_binomial_tree(nbytes: float, p: int, link: Link) -> float:
    """Binomial-tree reduce: ``ceil(log2 p) · (alpha + n·beta)`` (gamma not modeled).

    Source: Thakur et al. 2005 §4.3.
    """
    return broadcast_binomial_tree(nbytes, p, link)


# ------------------------------------------------------------------------------------- gather and scatter


def gather_binomial_tree(nbytes: float, p: int, link: Link) -> float:
    """Binomial-tree (minimum spanning tree) gather of n bytes per rank: ``ceil(log2 p)·alpha + (p-1)·n·beta``.

    Source: Chan et al. 2007 (MST gather: ``log2(p)alpha + (p-1)/p · N·beta`` with N = p·n at the root).
    """
    return all_gather_recursive_halving_doubling(nbytes, p, link)  # same step count and bytes at the root


def gather_direct(nbytes: float, p: int, link: Link) -> float:
    """Direct gather: the root receives p-1 pieces of n concurrently, ``alpha + (p-1)·n·beta`` (root link bound)."""
    return all_gather_direct(nbytes, p, link)  # the same bound: p-1 pieces of n over one rank's link


def scatter_binomial_tree(nbytes: float, p: int, link: Link) -> float:
    """Binomial-tree scatter of n bytes per rank: ``ceil(log2 p)·alpha + (p-1)·n·beta``. Source: Chan et al. 2007."""
    return gather_binomial_tree(nbytes, p, link)


def scatter_direct(nbytes: float, p: int, link: Link) -> float:
    """Direct scatter: the root sends p-1 pieces of n concurrently, ``alpha + (p-1)·n·beta``."""
    return gather_direct(nbytes, p, link)


# -------------------------------------------------------------------------------------------- all-to-all


def all_to_all_pairwise(nbytes: float, p: int, link: Link) -> float:
    """Pairwise-exchange all-to-all of a per-rank send buffer n (n/p per peer): ``(p-1)(alpha + n/p·beta)``.

    Source: Thakur, Rabenseifner & Gropp 2005 §3 (pairwise exchange, long messages).
    """
    n = _check(nbytes, p, link)
    if p == 1:
        return 0.0
    return (p - 1) * (link.alpha + n / p * link.beta(n))


def all_to_all_direct(nbytes: float, p: int, link: Link) -> float:
    """Direct all-to-all: all p-1 pieces of n/p concurrently, ``alpha + (p-1)/p · n·beta``."""
    n = _check(nbytes, p, link)
    if p == 1:
        return 0.0
    return link.alpha + (p - 1) / p * n * link.beta(n)


def _splits(
    nbytes: float, p: int, send_bytes: Sequence[float] | None, recv_bytes: Sequence[float] | None
) -> tuple[list[float], list[float]]:
    if send_bytes is None or recv_bytes is None:
        raise ValueError("all_to_all_v needs both send_bytes and recv_bytes (or neither: uniform n/p)")
    out: list[list[float]] = []
    for name, seq in (("send_bytes", send_bytes), ("recv_bytes", recv_bytes)):
        if len(seq) != p - 1:
            raise ValueError(f"{name} must list the p-1={p - 1} other peers, got {len(seq)} entries")
        vals = [check_finite(f"{name}[{i}]", v) for i, v in enumerate(seq)]
        if any(v < 0 for v in vals):
            raise ValueError(f"{name} entries must be >= 0, got {list(seq)!r}")
        out.append(vals)
    return out[0], out[1]


def all_to_all_v_pairwise(
    nbytes: float,
    p: int,
    link: Link,
    *,
    send_bytes: Sequence[float] | None = None,
    recv_bytes: Sequence[float] | None = None,
) -> float:
    """Pairwise all-to-all-v from this rank's view: ``sum_k (alpha + max(send_k, recv_k)·beta)``, k = 1..p-1.

    ``send_bytes[k-1]`` goes to rank ``(r+k) mod p`` and ``recv_bytes[k-1]`` comes from ``(r-k) mod p`` in step
    k (both directions at once, full duplex, so a step lasts as long as its larger side). Without splits,
    n/p to each peer (= :func:`all_to_all_pairwise`). Efficiency at ``max(sumsend, sumrecv)`` (``nbytes`` when
    uniform). Loops over the given per-peer list only. Source: Thakur et al. 2005 §3 (pairwise exchange).
    """
    n = _check(nbytes, p, link)
    if send_bytes is None and recv_bytes is None:
        return all_to_all_pairwise(n, p, link)  # uniform: the O(1) closed form, no per-peer list
    if p == 1:
        return 0.0
    send, recv = _splits(n, p, send_bytes, recv_bytes)
    beta = link.beta(max(sum(send), sum(recv)))
    return sum(link.alpha + max(s, r) * beta for s, r in zip(send, recv, strict=True))


def all_to_all_v_direct(
    nbytes: float,
    p: int,
    link: Link,
    *,
    send_bytes: Sequence[float] | None = None,
    recv_bytes: Sequence[float] | None = None,
) -> float:
    """Direct all-to-all-v from this rank's view: ``alpha + max(sum send_bytes, sum recv_bytes)·beta``.

    All sends and receives run concurrently on a full-duplex link, so the busier direction bounds the
    time. The collective's time is the max of this over ranks (caller's job: call it per rank). Without
    splits, n/p to each peer (= :func:`all_to_all_direct`).
    """
    n = _check(nbytes, p, link)
    if send_bytes is None and recv_bytes is None:
        return all_to_all_direct(n, p, link)  # uniform: the O(1) closed form
    if p == 1:
        return 0.0
    send, recv = _splits(n, p, send_bytes, recv_bytes)
    busiest = max(sum(send), sum(recv))
    return link.alpha + busiest * link.beta(busiest)


# ------------------------------------------------------------------------------------ barrier, send/recv


def barrier_dissemination(nbytes: float, p: int, link: Link) -> float:
    """Dissemination barrier: ``ceil(log2 p)·alpha`` (``nbytes`` ignored).

    Source: Hensgen, Finkel & Manber 1988; Thakur, Rabenseifner & Gropp 2005 (MPICH's barrier).
    """
    _check(nbytes, p, link)
    return _ceil_log2(p) * link.alpha


def send_recv_direct(nbytes: float, p: int, link: Link) -> float:
    """Point-to-point message: ``alpha + n·beta``; ``p`` is the pair's group (p == 1: send to self, costs 0)."""
    n = _check(nbytes, p, link)
    if p == 1:
        return 0.0
    return link.alpha + n * link.beta(n)


# -------------------------------------------------------------------------------------------- registry

_FLAT_ALL_REDUCE: Mapping[str, Callable[[float, int, Link], float]] = MappingProxyType(
    {
        "ring": all_reduce_ring,
        "double_binary_tree": all_reduce_double_binary_tree,
        "recursive_halving_doubling": all_reduce_recursive_halving_doubling,
        "direct": all_reduce_direct,
    }
)

#: (collective, algorithm) -> model(nbytes, p, link, **kw) -> microseconds, for the algorithms that run on
#: one link. Order within a collective is the tie-break order of ``pricing.make_pricer``'s ``auto`` (ring
#: first, as NCCL prefers it). ``hierarchical`` all-reduce runs over the topology's dimensions instead:
#: :func:`hierarchical_all_reduce`.
COST_MODELS: Mapping[tuple[str, str], Callable[..., float]] = MappingProxyType(
    {
        **{("all_reduce", name): fn for name, fn in _FLAT_ALL_REDUCE.items()},
        ("reduce_scatter", "ring"): reduce_scatter_ring,
        ("reduce_scatter", "recursive_halving_doubling"): reduce_scatter_recursive_halving_doubling,
        ("reduce_scatter", "direct"): reduce_scatter_direct,
        ("all_gather", "ring"): all_gather_ring,
        ("all_gather", "recursive_halving_doubling"): all_gather_recursive_halving_doubling,
        ("all_gather", "direct"): all_gather_direct,
        ("broadcast", "ring"): broadcast_ring,
        ("broadcast", "binomial_tree"): broadcast_binomial_tree,
        ("reduce", "ring"): reduce_ring,
        ("reduce", "binomial_tree"): reduce_binomial_tree,
        ("gather", "binomial_tree"): gather_binomial_tree,
        ("gather", "direct"): gather_direct,
        ("scatter", "binomial_tree"): scatter_binomial_tree,
        ("scatter", "direct"): scatter_direct,
        ("all_to_all", "pairwise"): all_to_all_pairwise,
        ("all_to_all", "direct"): all_to_all_direct,
        ("all_to_all_v", "pairwise"): all_to_all_v_pairwise,
        ("all_to_all_v", "direct"): all_to_all_v_direct,
        ("barrier", "dissemination"): barrier_dissemination,
        ("send_recv", "direct"): send_recv_direct,
    }
)

#: NCCL's own choice set (no MPICH-style recursive or direct algorithms): ``auto``'s candidates where modeled.
NCCL_ALGORITHMS: tuple[str, ...] = ("ring", "double_binary_tree")

def collectives() -> tuple[str, ...]:
    """The known collective names, in registry order."""
    return tuple(dict.fromkeys(c for c, _ in COST_MODELS))


def algorithms_for(collective: str) -> tuple[str, ...]:
    """The algorithms modeled for ``collective`` (all_reduce: also ``hierarchical``); ``ValueError`` naming the
    known collectives if unknown."""
    algos = tuple(a for c, a in COST_MODELS if c == collective)
    if not algos:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(collectives())}")
    return (*algos, "hierarchical") if collective == "all_reduce" else algos


def cost(collective: str, algorithm: str, nbytes: float, p: int, link: Link, **kw: Any) -> float:
    """Modeled time in microseconds of ``collective`` with a one-link ``algorithm`` on ``p`` ranks.

    ``nbytes`` as in the module docstring; ``kw`` goes to the model (``send_bytes``/``recv_bytes`` for
    all_to_all_v). Choosing an algorithm (``auto``) is ``pricing.make_pricer``'s job.
    """
    known = algorithms_for(collective)
    model = COST_MODELS.get((collective, algorithm))
    if model is None:
        raise ValueError(f"unknown algorithm {algorithm!r} for {collective}; known: {', '.join(known)}")
    return model(nbytes, p, link, **kw)
