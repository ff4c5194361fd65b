"""The raw per-rank capture that the in-rank bootstrap writes and the converter reads.

``nbox record`` launches the user's script's ranks (:mod:`nbox_trace.launch`) with nbox's bootstrap
injected. Each rank writes, into ``<work_dir>/rank<R>/``:

``host_et.json``
    ``torch.profiler.ExecutionTraceObserver`` output for the captured iteration(s) (PyTorch host ET,
    schema "1.1.1-chakra.0.0.4" on torch 2.13).
``kineto.json``
    The Kineto (``torch.profiler.profile``) Chrome trace of the same iteration(s), recorded in the
    same profiler session, so ET ``rf_id`` == Kineto ``args["Record function id"]``.
``kineto_lean.json``
    The Kineto trace of the lean pass, the iterations just before the capture, profiled by Kineto alone (no
    ET observer, no shapes): the operators' times without the observer's cost (:mod:`nbox_record.sources.leantiming`).
    Absent with ``--lean-iterations 0``.
``collectives.json``
    nbox's own log of every collective and p2p operation issued during the captured iteration(s)
    (gloo emits no ``record_param_comms``): a :class:`CollectiveLog`.
``timings.json``
    The clean (un-instrumented) iteration times and the facts of the run: a :class:`RankTimings`.
``progress.json``
    ``{"phase": "warmup|timing|lean|capture|done|failed", "iteration": N, "time_us": T}``, kept current about
    once a second by a background thread, so a run stopped at its deadline can say where each rank was.
``error.json``
    Only when the script failed on this rank: ``{"rank": R, "type": "...", "message": "...",
    "traceback": "..."}``.

All times are microseconds. Files are JSON (never pickle). Written atomically (temp + rename).
"""

from __future__ import annotations

from typing import TypedDict

RAW_FORMAT_VERSION = 1

HOST_ET = "host_et.json"
KINETO = "kineto.json"
KINETO_LEAN = "kineto_lean.json"
COLLECTIVES = "collectives.json"
TIMINGS = "timings.json"
ERROR = "error.json"
PROGRESS = "progress.json"
PEERS = "peers.json"  # multi-node runs: every rank's node (nbox_record.handoff.peers)

#: The zero-length ``record_function`` the capture opens at its start and after each captured iteration, in
#: both the host ET and Kineto (written by :mod:`nbox_record.capture.session`, read by
#: :mod:`nbox_record.convert.toplevel`).
BOUNDARY_MARKER = "## nbox:iteration_boundary ##"


class ProcessGroupInfo(TypedDict):
    """One process group as the rank saw it."""

    pg_name: str          # torch's group name, e.g. "0" for the default group
    pg_desc: str          # e.g. "default_pg"
    ranks: list[int]      # global ranks, in group-rank order
    backend: str          # e.g. "gloo", "nccl"


class CollectiveRecord(TypedDict):
    """One collective or p2p operation, in issue order on this rank."""

    seq: int                  # 0-based issue order among the captured collectives of this rank
    op: str                   # the c10d op, e.g. "allreduce_", "allgather_into_tensor_coalesced_", "send"
    comm_type: str            # Chakra CollectiveCommType name ("ALL_REDUCE", ...) or "SEND" / "RECV"
    pg_name: str              # process group name (see ProcessGroupInfo)
    dtype: str                # e.g. "float32"
    in_numel: int             # elements in the input tensor(s) of this rank
    out_numel: int            # elements in the output tensor(s) of this rank
    elem_bytes: int           # bytes per element
    comm_bytes: int           # the comm_size written to Chakra: per-rank input bytes (see below)
    in_split_sizes: list[int]  # all-to-all(v): elements per peer sent, else []
    out_split_sizes: list[int]  # all-to-all(v): elements per peer received, else []
    peer: int | None          # send/recv: the global rank of the other end, else None
    tag: int | None           # send/recv: the tag, else None
    root: int | None          # broadcast/reduce/gather/scatter: the global root rank, else None
    async_op: bool            # True when the script got a Work object back (waited on later)
    issue_us: float           # wall clock (time.time()*1e6) when issued
    wait_us: float | None     # when the script waited on it (None: blocking or never waited)
    done_us: float | None     # when it completed, if known


class CollectiveLog(TypedDict):
    version: int
    rank: int
    world_size: int
    process_groups: list[ProcessGroupInfo]
    collectives: list[CollectiveRecord]


class _RankTimingsRequired(TypedDict):
    version: int
    rank: int
    local_rank: int
    world_size: int
    backend: str                 # "gloo" | "nccl"
    device: str                  # "cpu" | "cuda:0" ...
    boundary: str                # how iterations were found: "optimizer_step" | "profiler_step" | "marker"
    warmup: int                  # iterations skipped before timing
    iteration_us: list[float]    # the K clean iterations (no profiler attached)
    captured_iterations: int     # iterations recorded with the ET observer + Kineto
    torch: str                   # torch.__version__
    cuda: str | None             # torch.version.cuda
    nccl: str | None             # NCCL version string, if any
    hostname: str
    python: str


class RankTimings(_RankTimingsRequired, total=False):
    # per clean iteration, the training thread's time on a CPU and runnable waiting for one (nbox_trace/threadtime.py)
    iteration_cpu_us: list[float]
    iteration_run_queue_us: list[float]
    # per clean iteration whose collectives were all sampled: [on CPU, run queue] of each segment between the
    # collectives the training thread issued (start -> first, between consecutive ones, last -> end;
    # nbox_record/capture/segments.py)
    iteration_segments_us: list[list[list[float]]]
    # per captured iteration (profiler on): wall, and the same thread times; the first one is timed from the end
    # of the profiler's start (recordclock.py). The replay compares them with the clean ones
    # (nbox_replay.inputs.profiler)
    capture_iteration_us: list[float]
    capture_cpu_us: list[float]
    capture_run_queue_us: list[float]
    # the job this rank belonged to: the same on every rank of one run, on every node (recordfacts.job_identity)
    job: dict[str, str | int | None]
    # the rank's CPU quota as a fraction of one CPU (nbox_trace/threadtime.py cpu_share; None: no quota)
    cpu_share: float | None


#: Name prefix of the record function opened around each logged collective's redispatch.
IDENTITY_PREFIX = "nbox::collective/"


def identity_marker(record: CollectiveRecord) -> str:
    """``nbox::collective/<pg_name>/<seq>/<op>``: the record's identity, written into the host ET."""
    return f"{IDENTITY_PREFIX}{record['pg_name']}/{record['seq']}/{record['op']}"


def parse_identity_marker(name: str) -> tuple[str, int, str] | None:
    """``(pg_name, seq, op)`` of an identity marker's name, else None."""
    if not name.startswith(IDENTITY_PREFIX):
        return None
    parts = name[len(IDENTITY_PREFIX):].rsplit("/", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1]), parts[2]
