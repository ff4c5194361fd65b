"""The question a what-if asks, and its answer, in the words a report opens with.

A report's first line answers the question the user asked (``nbox replay``, ``nbox emulate``)::

    what-if (64 ranks, 10 Gb/s): T ms per iteration, Nx slower than the baseline's B ms; P percent of it
    exposed communication

:func:`describe_changes` names what the what-if changed: the shipped or given scenario when one was named, the
world size, and each ``--set`` key in words where nbox knows it (a link's bandwidth, a latency, the compute
speed, a mesh degree), else as typed. :func:`compare` says a ratio the way a person reads it: "Nx slower
than", "Nx faster than", or "about the same as" within :data:`SAME_WITHIN` of 1.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from emulator_core.scenario.model import Scenario

__all__ = ["SAME_WITHIN", "Comparison", "compare", "describe_changes", "describe_override", "share_words"]

#: Two times closer than this (relative) are "about the same".
SAME_WITHIN = 0.01

_DIM_KEY = re.compile(r"topology\.dims\.(\d+)\.(\w+)")


def describe_override(text: str, scenario: Scenario | None = None) -> str | None:
    """One ``--set key=value`` in words (``topology.dims.0.bandwidth_gbps=10`` -> ``10 Gb/s``); None for
    ``world_size`` (the world size is said on its own) and for a replay setting (``replay.*``)."""
    key, _, value = text.partition("=")
    key, value = key.strip(), value.strip().strip("\"'")
    if key == "world_size" or key.startswith("replay."):
        return None
    m = _DIM_KEY.fullmatch(key)
    if m is not None:
        index, field = int(m.group(1)), m.group(2)
        dims = scenario.topology.dims if scenario is not None else ()
        on = f" {dims[index].name}" if len(dims) > 1 and index < len(dims) else ""
        words = {"bandwidth_gbps": f"{value} Gb/s{on}", "latency_us": f"{value} us latency{on}",
                 "size": f"{on.strip() or 'dimension ' + str(index)} size {value}"}
        return words.get(field, f"{key}={value}")
    if key == "compute_scale":
        return f"compute x{value}"
    if key.startswith("mesh."):
        return f"{key[5:]}={value}"
    return f"{key}={value}"


def describe_changes(named: str | Path | None, overrides: Sequence[str], scenario: Scenario,
                     mesh: str | None = None) -> list[str]:
    """What the what-if changed, in words: the scenario the user named (its short name, else the file's stem;
    none when ``named`` is None), its world size, the mesh asked for (``--mesh``), then each override
    (:func:`describe_override`)."""
    parts = []
    if named is not None:
        parts.append(scenario.name or Path(named).stem)
    parts.append(f"{scenario.world_size} rank" + ("s" if scenario.world_size != 1 else ""))
    if mesh:
        parts.append(f"mesh {mesh}")
    parts += [w for o in overrides if (w := describe_override(o, scenario)) is not None]
    return parts


@dataclass(frozen=True)
class Comparison:
    """A time against a reference: ``ratio`` = time / reference (> 1: slower); ``direction`` ``slower``,
    ``faster`` or ``same``; ``words``: "Nx slower than", "Nx faster than", "about the same as"."""

    ratio: float
    direction: str
    words: str

    def to_dict(self) -> dict[str, object]:
        return {"ratio": self.ratio, "direction": self.direction, "words": self.words}


def _times(x: float) -> str:
    return f"{x:.2f}x" if x < 2 else f"{x:.1f}x"


def compare(time_us: float, reference_us: float) -> Comparison | None:
    """``time_us`` against ``reference_us`` in words (module docstring); None when either is not a positive
    finite time (a ratio over a zero time means nothing)."""
    if not (time_us > 0 and reference_us > 0 and math.isfinite(time_us) and math.isfinite(reference_us)):
        return None
    ratio = time_us / reference_us
    if abs(ratio - 1.0) < SAME_WITHIN:
        return Comparison(ratio, "same", "about the same as")
    if ratio > 1:
        return Comparison(ratio, "slower", f"{_times(ratio)} slower than")
    return Comparison(ratio, "faster", f"{_times(1 / ratio)} faster than")


def share_words(part_us: float, whole_us: float, what: str) -> str | None:
    """``"P% of it exposed communication"`` (P the rounded percentage); None when the whole is not a positive
    finite time."""
    if not (whole_us > 0 and math.isfinite(whole_us) and math.isfinite(part_us)):
        return None
    return f"{round(100 * max(0.0, part_us) / whole_us)}% of it {what}"
