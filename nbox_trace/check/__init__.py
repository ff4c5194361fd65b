"""The trace checker: validate and summarize Chakra traces: what is in them, and what is wrong with them.

:func:`inspect_trace` is the library behind ``nbox trace inspect``. Per rank it streams the file
once and reports: metadata version and ``schema`` attribute, node counts by type, collectives by
process group and type (count, total bytes), point-to-point traffic, total COMP duration, roots,
dependency depth and critical-path length, and every problem with its node id. Across ranks it
checks that each process group's sequence of collectives (type and size) is the same on all member
ranks, and that point-to-point sends and receives pair up; a mismatch is what hangs a replay.

Dependencies are the union of ``data_deps`` and ``ctrl_deps``, as ASTRA-sim's current feeder waits
on both. Depth counts nodes on the longest dependency chain; the critical path is the longest chain
by the sum of ``duration_micros`` (microseconds). Both are computed with Kahn's algorithm, without
recursion, so a 1M-node chain is fine.

Problems are facts, not exceptions: an undecodable file raises (``TraceDecodeError``), everything a
decodable file does wrong is a :class:`Problem`. Problems of one kind beyond
:data:`MAX_PROBLEMS_PER_CODE` per rank are folded into one entry with a count.

The checker is split by concern: per-rank checks (``rank``), graph metrics (``graph``), group membership
(``groups``), cross-rank and p2p checks (``crossrank``), and what it reports (``report``). This ``__init__`` is
the room's door (``__all__``). May import: ``nbox_trace.chakra`` and the base's own modules.
"""

from __future__ import annotations

import os

from nbox_trace.chakra import DEFAULT_MAX_MESSAGE_BYTES, TraceSet, resolve_trace_set
from nbox_trace.check.crossrank import check_cross_rank
from nbox_trace.check.groups import find_comm_group_file, load_comm_groups, membership
from nbox_trace.check.rank import inspect_rank
from nbox_trace.check.report import (
    MAX_PROBLEMS_PER_CODE,
    REPORT_SCHEMA,
    CollectiveStat,
    Problem,
    RankReport,
    TraceReport,
    iter_problem_lines,
)


def inspect_trace(path: str | os.PathLike[str] | TraceSet, *, comm_group: str | os.PathLike[str] | None = None,
                  max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> TraceReport:
    """Summarize and validate a trace: one ``.et``, a directory, or a ``<prefix>`` of per-rank files.

    Args:
        path: what the user named, or an already resolved TraceSet.
        comm_group: an ASTRA-sim ``comm_group.json`` giving process-group membership; by default one
            beside the traces (or in ``../inputs/``) is used, else the METADATA process-group nodes.

    Raises:
        InputNotFoundError, InvalidInputError, TraceDecodeError: see resolve_trace_set and EtReader.
    """
    trace_set = path if isinstance(path, TraceSet) else resolve_trace_set(path)
    reports = [inspect_rank(p, rank, max_message_bytes=max_message_bytes) for rank, p in trace_set.files.items()]
    groups, source = membership(trace_set, reports, comm_group)
    problems = check_cross_rank(reports, groups)
    return TraceReport(trace_set.prefix, str(trace_set.directory), reports, groups, source, problems)



__all__ = [
    "MAX_PROBLEMS_PER_CODE", "REPORT_SCHEMA", "CollectiveStat", "Problem", "RankReport",
    "TraceReport", "check_cross_rank", "find_comm_group_file", "inspect_rank", "inspect_trace",
    "iter_problem_lines", "load_comm_groups",
]
