"""The one launcher: ``nbox record``, ``nbox emulate``, ``nbox calibrate`` and ``nbox replay --clock real`` all
start their ranks here.

A :class:`Launch` (frozen) says what to run: a script or a module, its arguments, the ranks per node, the nodes and
rendezvous, the environment added for the ranks, the deadline (seconds) and the log folder. :func:`command` and
:func:`environment` build the command line and the ranks' environment; :func:`run` runs it and returns a
:class:`LaunchResult`, whose :meth:`LaunchResult.failure` reads what the ranks left (error files, stderr logs, the
launcher's verdict) into a :class:`Failure` naming the root cause by the one :func:`root_error` rule.

* One node (no ``rdzv_endpoint``): nbox starts the ranks itself (:mod:`nbox_trace.launch.localrun`). Several nodes:
  ``python -m torch.distributed.run`` with c10d rendezvous at the endpoint, ``--max-restarts 0 --redirects 3``.
* Logs: each rank's stdout/stderr in ``<log_dir>/<run>/attempt_0/<local rank>/std{out,err}.log``, the launcher's
  own lines in ``<log_dir>/launcher.log`` (a command's stdout is its ``--json`` document, never a rank's).
* A node of a multi-node run (:func:`settle`): ``--local-addr`` is this node's address on the route to the endpoint,
  ``--rdzv-conf is_host=1`` where the endpoint's address is this node's own and this is node rank 0 (``is_host=0``
  otherwise), ``GLOO_SOCKET_IFNAME`` the interface holding the local address; each unless the launch or the
  caller's environment says otherwise.
* Environment: the caller's without the variables of an enclosing nbox run (:data:`DROPPED`), plus the launch's;
  ``PYTHONPATH`` = the launch's prefix, the nbox packages' folder (unless installed), the inherited one;
  ``OMP_NUM_THREADS=1``, ``PYTHONFAULTHANDLER=1`` unless set; ``PYTHONUNBUFFERED=1``.
* Deadline: past ``timeout_s``, on an interrupt, or when a rank fails, the ranks' process groups get SIGTERM, then
  SIGKILL (torchrun's, or each rank's: each runs in a session of its own).

This module does not import torch: the ranks (and torchrun) run as child processes. Why: docs/design/launcher.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import ipaddress
import json
import os
import re
import socket
import struct
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from nbox_trace.errors import InvalidInputError, NboxError, UsageError
from nbox_trace.launch.localrun import exit_text, run_local, stop_group

__all__ = ["DROPPED", "MESSAGE_CHARS", "TAIL_LINES", "Failure", "Launch", "LaunchConfigError", "LaunchError",
           "LaunchResult", "Nodes",
           "RankError", "check_nodes", "command", "environment", "interface_of", "is_consequence", "is_local_address",
           "parse_endpoint", "python_path", "rank_tails", "read_rank_error", "root_cause", "root_error",
           "route_source", "run", "seconds_text", "settle", "then_failed"]

#: Inherited variables that belong to an enclosing nbox run and must not reach a new run's ranks: a rank that
#: inherits ``NBOX_RECORD_DIR`` would capture into that run's folder, ``NBOX_SCENARIO_SET`` would override
#: this run's scenario, ``NBOX_NODE_ADDR`` would name another run's node.
DROPPED = ("NBOX_RECORD_DIR", "NBOX_SCENARIO_SET", "NBOX_NODE_ADDR")
#: How many of a log's last lines a failure report keeps.
TAIL_LINES = 8
#: How many characters of a rank's error message a failure report keeps.
MESSAGE_CHARS = 500
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


class LaunchConfigError(InvalidInputError):
    """A launch setting is invalid (the message names it)."""


class LaunchError(NboxError):
    """The ranks (or torchrun) could not be started: the operating system refused (the message says what)."""


@dataclass(frozen=True)
class Launch:
    """What to run: ranks of a script or module on this node (and, with an endpoint, on the others).

    Attributes:
        program: the script's path, or the module's name when ``module`` is true.
        args: the program's arguments.
        nproc_per_node: ranks started on this node (>= 1).
        nnodes, node_rank, rdzv_endpoint: torchrun's; a run over more than one node needs an endpoint.
        local_addr: this node's address, advertised to the other nodes (torchrun's ``--local-addr``); None: found
            by :func:`settle`.
        rdzv_host: whether this node hosts the rendezvous store (``--rdzv-conf is_host``); None: decided by
            :func:`settle`.
        env: variables added to the ranks' environment (they win over inherited ones).
        pythonpath: folders put first on ``PYTHONPATH``, before the nbox packages' folder.
        timeout_s: deadline for the whole run, seconds (> 0).
        log_dir: each rank's stdout/stderr (torchrun's ``--log-dir`` layout), and the launcher's own lines.
    """

    program: str
    log_dir: Path
    module: bool = False
    args: tuple[str, ...] = ()
    nproc_per_node: int = 1
    nnodes: str = "1"
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    local_addr: str | None = None
    rdzv_host: bool | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    pythonpath: tuple[str, ...] = ()
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if isinstance(self.nproc_per_node, bool) or not isinstance(self.nproc_per_node, int) \
                or self.nproc_per_node < 1:
            raise LaunchConfigError(f"nproc_per_node: must be an integer >= 1, got {self.nproc_per_node!r}")
        if self.nnodes != "1" and not self.rdzv_endpoint:
            raise LaunchConfigError(f"nnodes = {self.nnodes!r}: a run over several nodes needs an rdzv_endpoint")
        if self.rdzv_endpoint:
            parse_endpoint(self.rdzv_endpoint)
        if not self.timeout_s > 0:
            raise LaunchConfigError(f"timeout_s: must be a number of seconds > 0, got {self.timeout_s!r}")
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))


def command(launch: Launch) -> list[str]:
    """The command line of ``launch`` (module docstring): on one node, each rank's own (``python [-m] program
    args``; nbox starts ``nproc_per_node`` of them); across nodes, ``python -m torch.distributed.run ...``."""
    program = [*(["-m"] if launch.module else []), launch.program, *launch.args]
    if not launch.rdzv_endpoint:
        return [sys.executable, *program]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", launch.nnodes, "--node-rank",
           str(launch.node_rank), "--rdzv-backend", "c10d", "--rdzv-endpoint", launch.rdzv_endpoint]
    if launch.rdzv_host is not None:
        cmd += ["--rdzv-conf", f"is_host={int(launch.rdzv_host)}"]
    if launch.local_addr:
        cmd += ["--local-addr", launch.local_addr]
    cmd += ["--nproc-per-node", str(launch.nproc_per_node), "--max-restarts", "0", "--log-dir", str(launch.log_dir),
            "--redirects", "3"]
    return [*cmd, *program]


def python_path(prefix: Sequence[str], inherited: str | None) -> str:
    """``PYTHONPATH`` for the ranks: ``prefix``, the folder holding the nbox packages (so that a checkout works
    from anywhere; skipped for an installed nbox, importable anyway), then the ``inherited`` one."""
    parts = list(prefix)
    if _PACKAGE_ROOT.name not in ("site-packages", "dist-packages"):
        parts.append(str(_PACKAGE_ROOT))
    return os.pathsep.join(parts + ([inherited] if inherited else []))


def environment(launch: Launch, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ranks' environment: ``base`` (default: this process's) less :data:`DROPPED`, plus ``launch.env``;
    ``PYTHONPATH`` from :func:`python_path` unless ``launch.env`` sets it; one OpenMP thread and Python's fault
    handler unless set."""
    inherited = dict(os.environ if base is None else base)
    env = {k: v for k, v in inherited.items() if k not in DROPPED}
    env["PYTHONPATH"] = python_path(launch.pythonpath, inherited.get("PYTHONPATH"))
    env.update(launch.env)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONFAULTHANDLER", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


# ------------------------------------------------------------------------------------------- one node of several

#: torchrun's default rendezvous port.
DEFAULT_RDZV_PORT = 29400
_SIOCGIFADDR = 0x8915


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """(host, port) of ``HOST[:PORT]`` or ``[IPv6]:PORT`` (port default :data:`DEFAULT_RDZV_PORT`)."""
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d{1,5}))?|([^:\[\]\s]+)(?::(\d{1,5}))?", endpoint.strip())
    port = (m.group(2) or m.group(4)) if m else None
    if m is None or (port is not None and not 0 < int(port) < 65536):
        raise LaunchConfigError(f"rdzv_endpoint {endpoint!r}: expected HOST:PORT (e.g. 10.0.0.1:29400)")
    return (m.group(1) or m.group(3)), int(port) if port else DEFAULT_RDZV_PORT


def _resolve(host: str) -> str | None:
    try:
        return str(socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0])
    except (OSError, IndexError, UnicodeError):
        with contextlib.suppress(OSError, IndexError, UnicodeError):
            return str(socket.getaddrinfo(host, None, socket.AF_INET6, socket.SOCK_STREAM)[0][4][0])
    return None


def is_local_address(addr: str) -> bool:
    """Whether ``addr`` is an address of this machine (this network namespace): one it can bind to."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.bind((addr, 0))
        return True
    except OSError:
        return False


def route_source(addr: str, port: int = DEFAULT_RDZV_PORT) -> str | None:
    """This machine's address on the route to ``addr`` (what a connection to it would come from), or None when
    there is no route. Sends nothing: a UDP socket's connect only picks the route."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((addr, port))
            return str(sock.getsockname()[0])
    except OSError:
        return None


def interface_of(addr: str) -> str | None:
    """The name of the network interface holding the IPv4 address ``addr`` (None: none does, or IPv6)."""
    if ":" in addr:
        return None
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            with contextlib.suppress(OSError):
                raw = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
                if socket.inet_ntoa(raw[20:24]) == addr:
                    return name
    return None


def check_nodes(nnodes: str, node_rank: int, rdzv_endpoint: str | None, local_addr: str | None) -> None:
    """Check the multi-node flags of ``nbox record`` and ``nbox calibrate``: a UsageError (exit 2) naming the flag
    as typed, before anything starts, never a run that waits for nodes that cannot meet."""
    if not re.fullmatch(r"[1-9]\d{0,4}(:[1-9]\d{0,4})?", nnodes or ""):
        raise UsageError(f"--nnodes {nnodes!r}: expected a node count (2) or a range MIN:MAX (1:4)")
    if node_rank < 0:
        raise UsageError(f"--node-rank must be >= 0, got {node_rank}")
    if nnodes != "1" and not rdzv_endpoint:
        raise UsageError(f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT (the rendezvous every node joins)")
    if rdzv_endpoint:
        try:
            parse_endpoint(rdzv_endpoint)
        except InvalidInputError:
            raise UsageError(f"--rdzv-endpoint {rdzv_endpoint!r}: expected HOST:PORT (e.g. 10.0.0.1:29400)") from None
    if local_addr is not None and not rdzv_endpoint:
        raise UsageError("--local-addr applies to a multi-node run: give --rdzv-endpoint too")


@dataclass(frozen=True)
class Nodes:
    """The multi-node flags as one value (``--nnodes --node-rank --rdzv-endpoint --local-addr --rdzv-host``),
    checked by :func:`check_nodes` at construction; a fixed node count only (commands that split their ranks
    over the nodes cannot follow an elastic range)."""

    nnodes: str = "1"
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    local_addr: str | None = None
    rdzv_host: bool | None = None

    def __post_init__(self) -> None:
        check_nodes(self.nnodes, self.node_rank, self.rdzv_endpoint, self.local_addr)
        if not self.nnodes.isdigit():
            raise UsageError(f"--nnodes {self.nnodes!r}: this command needs a fixed number of nodes, not a range")
        if self.node_rank >= int(self.nnodes):
            raise UsageError(f"--node-rank {self.node_rank} is not a node of --nnodes {self.nnodes} "
                             f"(0..{int(self.nnodes) - 1})")

    @property
    def count(self) -> int:
        return int(self.nnodes)

    def shifted(self, k: int) -> Nodes:
        """The same nodes rendezvousing at the endpoint's port + ``k``: the ``k``-th of several launches in a row
        (a node that starts launch k + 1 early must not join launch k's store while it is still up)."""
        if not self.rdzv_endpoint or k == 0:
            return self
        host, port = parse_endpoint(self.rdzv_endpoint)
        if port + k > 65535:
            raise UsageError(f"--rdzv-endpoint {self.rdzv_endpoint}: launch {k} would need port {port + k} > 65535")
        shown = f"[{host}]" if ":" in host else host
        return dataclasses.replace(self, rdzv_endpoint=f"{shown}:{port + k}")

    def launch_fields(self) -> dict[str, Any]:
        """The matching :class:`Launch` keyword arguments."""
        return {"nnodes": self.nnodes, "node_rank": self.node_rank, "rdzv_endpoint": self.rdzv_endpoint,
                "local_addr": self.local_addr, "rdzv_host": self.rdzv_host}


def settle(launch: Launch, base_env: Mapping[str, str] | None = None) -> Launch:
    """``launch`` with what a node of a multi-node run must tell torchrun (module docstring): its local address,
    whether it hosts the rendezvous store, and gloo's interface. A single-node launch comes back as it is."""
    if not launch.rdzv_endpoint:
        return launch
    host, port = parse_endpoint(launch.rdzv_endpoint)
    ip = _resolve(host)
    local = launch.local_addr or (route_source(ip, port) if ip else None)
    is_host = launch.rdzv_host
    if is_host is None and ip is not None and (ipaddress.ip_address(ip).is_loopback or is_local_address(ip)):
        is_host = launch.node_rank == 0
    env = dict(launch.env)
    inherited = os.environ if base_env is None else base_env
    if local and "GLOO_SOCKET_IFNAME" not in env and "GLOO_SOCKET_IFNAME" not in inherited:
        iface = interface_of(local)
        if iface:
            env["GLOO_SOCKET_IFNAME"] = iface
    if local:
        env.setdefault("NBOX_NODE_ADDR", local)  # the ranks say which node they run on (nbox_record.handoff.peers)
    return replace(launch, local_addr=local, rdzv_host=is_host, env=env)


# ------------------------------------------------------------------------------------------- running


def _run_with_deadline(cmd: Sequence[str], env: Mapping[str, str], timeout_s: float) -> tuple[int | None, bool, str]:
    """Run ``cmd`` in its own session, stdout discarded, stderr captured; past ``timeout_s`` seconds, or if the
    caller is interrupted, stop its whole process group. Returns (exit code or None when stopped, timed out,
    stderr)."""
    proc = subprocess.Popen(list(cmd), env=dict(env), start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_group([proc])
        return None, True, ""
    except BaseException:
        stop_group([proc])
        raise
    return proc.returncode, False, (err or b"").decode(errors="replace")


@dataclass(frozen=True)
class LaunchResult:
    """How a launch ended: the launcher's exit code (None when stopped at the deadline), its own stderr, and, from
    nbox's own launcher, the ranks seen failed first (``localrun.LocalRun.failures``; torchrun's verdict, one rank,
    is read from its stderr instead)."""

    launch: Launch
    returncode: int | None
    timed_out: bool
    stderr: str
    first_failures: tuple[tuple[int, str], ...] = ()

    @property
    def ok(self) -> bool:
        """Whether the launch exited with 0 before the deadline."""
        return self.returncode == 0 and not self.timed_out

    def failure(self, error_files: Mapping[int, Path]) -> Failure:
        """What went wrong, from the ranks' error files (global rank -> path; see :class:`RankError`), their
        stderr logs and the launcher's verdict (see :class:`Failure` for the rule)."""
        errors = [e for rank, path in sorted(error_files.items()) if (e := read_rank_error(rank, path)) is not None]
        verdict = _verdict(self.stderr)
        seen = self.first_failures or ((verdict,) if verdict is not None else ())
        tails = rank_tails(self.launch.log_dir)
        launcher_tail = _tail(self.stderr)
        nproc = self.launch.nproc_per_node
        reported = {e.rank for e in errors}
        failed = tuple(sorted(reported | {rank for rank, _ in seen}))
        silent = [f for f in seen if f[0] not in reported]
        if silent:
            # The first rank to fail left no error file (a signal, os._exit): the others' errors are consequences.
            return Failure(silent[0][0], None, silent[0][1], failed, self.timed_out, self.returncode, tails,
                           launcher_tail, nproc)
        if errors:
            root = errors[root_error([(e.time_us, e.rank, e.message) for e in errors])]
            return Failure(root.rank, root, None, failed, self.timed_out, self.returncode, tails, launcher_tail,
                           nproc)
        return Failure(None, None, None, (), self.timed_out, self.returncode, tails, launcher_tail, nproc)


def run(launch: Launch) -> LaunchResult:
    """Run ``launch`` with its deadline (module docstring); the launcher's own lines are kept in
    ``<log_dir>/launcher.log``."""
    launch = settle(launch)
    first: tuple[tuple[int, str], ...] = ()
    cmd = command(launch)
    try:
        launch.log_dir.mkdir(parents=True, exist_ok=True)
        if launch.rdzv_endpoint:
            rc, timed_out, err = _run_with_deadline(cmd, environment(launch), launch.timeout_s)
        else:
            local = run_local(cmd, environment(launch), launch.nproc_per_node, launch.log_dir, launch.timeout_s)
            rc, timed_out, err, first = local.returncode, local.timed_out, local.log, local.failures
    except (OSError, subprocess.SubprocessError) as exc:  # ranks that started are stopped first (run_local)
        raise LaunchError(f"could not start {cmd[0]} {' '.join(cmd[1:3])} ...: {exc}") from None
    with contextlib.suppress(OSError):  # the launch's result matters more than its log
        (launch.log_dir / "launcher.log").write_text(err, encoding="utf-8", errors="replace")
    return LaunchResult(launch, rc, timed_out, err, first)


# ------------------------------------------------------------------------------------------- failures


@dataclass(frozen=True)
class RankError:
    """A rank's error file: ``{"type", "message", "time_us", ...}``, whatever else its worker adds (``doc``).

    ``time_us``: when it was written, microseconds since the epoch (the file's mtime when absent).
    ``message``: at most :data:`MESSAGE_CHARS` characters.
    """

    rank: int
    time_us: float
    type: str
    message: str
    doc: Mapping[str, Any]


def read_rank_error(rank: int, path: Path) -> RankError | None:
    """``path``'s error report, or None when it is missing or unreadable (a rank killed while writing it)."""
    try:
        doc = json.loads(path.read_bytes())
        mtime_us = path.stat().st_mtime * 1e6
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    try:
        time_us = float(doc.get("time_us") or mtime_us)
    except (TypeError, ValueError):
        time_us = mtime_us
    return RankError(rank, time_us, str(doc.get("type") or "error"), str(doc.get("message", ""))[:MESSAGE_CHARS],
                     MappingProxyType(doc))


#: How a rank's error reads when it only reports that a peer went away first (gloo's "Connection closed by
#: peer", a reset socket, NCCL's remote error): a consequence, never the root cause of a failed run.
_CONSEQUENCE = re.compile(r"connection closed by peer|connection reset by peer|broken pipe|remote worker crash"
                          r"|remote process exited|ncclRemoteError", re.I)


def is_consequence(message: str) -> bool:
    """Whether a rank's error message only says that a peer failed first (see :data:`_CONSEQUENCE`)."""
    return _CONSEQUENCE.search(message) is not None


def root_error(errors: Sequence[tuple[float, int, str]]) -> int:
    """Index into ``errors`` ((time, rank, message) per failed rank) of the root cause of a failed run.

    The earliest error that is not a consequence of a peer's failure; when all are consequences, the earliest.
    Time alone is not enough: when a rank's call times out, gloo closes its sockets before that rank has
    written its own error, so its peer's "Connection closed by peer" can be written first.
    """
    if not errors:
        raise ValueError("root_error needs at least one error")
    return min(range(len(errors)),
               key=lambda i: (is_consequence(errors[i][2]), errors[i][0], errors[i][1]))


_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)"
                         r"[^\n]*?(?:\((SIG\w+)\))?\s*$", re.S | re.M)


def _verdict(torchrun_stderr: str) -> tuple[int, str] | None:
    """torchrun's "Root Cause (first observed failure)": (rank, "exited with code -9 (SIGKILL)"), if it gave one."""
    match = _ROOT_CAUSE.search(torchrun_stderr)
    if match is None:
        return None
    rank, code, sig = match.groups()
    return int(rank), (exit_text(int(code)) if sig else f"exited with code {code}")


def root_cause(torchrun_stderr: str) -> tuple[int, str] | None:
    """torchrun's own verdict on a failed run: (rank, "rank 1 exited with code -9 (SIGKILL)"), if it gave one."""
    verdict = _verdict(torchrun_stderr)
    return None if verdict is None else (verdict[0], f"rank {verdict[0]} {verdict[1]}")


#: Lines a native abort prints before Python's fault handler (libstdc++'s terminate, glog's fatal line, an
#: assert): the reason, which "Fatal Python error: Aborted" alone does not give.
_NATIVE_REASON = re.compile(r"terminate called|what\(\)|Exception raised from|Assertion .* failed|^F\d{4} |"
                            r"\[enforce fail|^ERROR|error:", re.IGNORECASE)


def _tail(text: str) -> str:
    """The last :data:`TAIL_LINES` lines of ``text``; for a rank that crashed (Python's fault handler wrote
    "Fatal Python error: ..."), the native reason printed just before it (up to 4 lines, :data:`_NATIVE_REASON`),
    that line and the crashing thread's frames (its "Current thread" block, at most 2 x :data:`TAIL_LINES`
    lines) instead: what killed it and where. A crash on a thread that runs no Python code (gloo's, the
    profiler's) has no "Current thread" block; the excerpt says so rather than quote a bystander thread."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    fatal = [i for i, line in enumerate(lines) if line.startswith("Fatal Python error")]
    if not fatal:
        return "\n".join(lines[-TAIL_LINES:])
    at = fatal[-1]
    before = lines[max(0, at - 4):at]
    first = next((i for i, line in enumerate(before) if _NATIVE_REASON.search(line)), len(before))
    reason = before[first:]
    after = lines[at + 1:]
    start = next((i for i, line in enumerate(after) if line.startswith("Current thread")), None)
    if start is None:
        return "\n".join([*reason, lines[at], "(no Python frames on the crashing thread: a native thread failed)"])
    stack: list[str] = []
    for line in after[start:start + 2 * TAIL_LINES]:
        if stack and not line.startswith(" "):  # the next thread's block, "Extension modules: ...", other output
            break
        stack.append(line)
    return "\n".join([*reason, lines[at], *stack])


def rank_tails(log_dir: Path) -> dict[int, str]:
    """Each rank's last :data:`TAIL_LINES` stderr lines (non-empty ones only), by local rank."""
    out: dict[int, str] = {}
    for log in sorted(log_dir.rglob("stderr.log")):
        if log.parent.name.isdigit():
            try:
                tail = _tail(log.read_text(errors="replace"))
            except OSError:
                continue
            if tail:
                out.setdefault(int(log.parent.name), tail)
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class Failure:
    """What a failed launch left behind. Ranks are global ones (0 .. nnodes x nproc_per_node - 1).

    The root cause: when the launcher (nbox's own, or torchrun's verdict) names a rank that left no error file
    (killed by a signal, ``os._exit``), that rank (``exit_text`` says how it ended); otherwise the error file
    chosen by :func:`root_error`; otherwise none is known (``root_rank`` is None: a deadline, or an exit without
    any report).

    Attributes:
        root_rank: the root cause's rank, or None.
        root_error: its error file, or None (it left none, or no root is known).
        exit_text: "exited with code -9 (SIGKILL)" for a root without an error file.
        failed_ranks: every rank known to have failed, sorted.
        timed_out, returncode: as in :class:`LaunchResult`.
        stderr_tails: each rank's last stderr lines, by local rank (ranks that wrote nothing are left out).
        launcher_tail: the launcher's own last lines (torchrun's stderr across nodes).
        nproc_per_node: ranks per node (a rank's local rank is its rank modulo this: torchrun's numbering).
    """

    root_rank: int | None
    root_error: RankError | None
    exit_text: str | None
    failed_ranks: tuple[int, ...]
    timed_out: bool
    returncode: int | None
    stderr_tails: Mapping[int, str]
    launcher_tail: str
    nproc_per_node: int = 1

    @property
    def others(self) -> list[int]:
        """The failed ranks other than the root cause's."""
        return [r for r in self.failed_ranks if r != self.root_rank]

    def tail_text(self) -> str:
        """The first rank's last stderr lines (the launcher's when no rank wrote any), as an indented block that
        starts on a new line; empty when there are none."""
        name, tail = next(((f"local rank {r}", t) for r, t in self.stderr_tails.items()),
                          ("the launcher", self.launcher_tail))
        return _block(f"{name}'s", tail)

    def root_tail_text(self) -> str:
        """The root cause's own last stderr lines (from this node's logs), as in :meth:`tail_text`; empty when it
        wrote none. For a rank killed by a signal this is all there is to say why (a fault handler's stack, an
        abort's "terminate called ...")."""
        if self.root_rank is None:
            return ""
        return _block("its", self.stderr_tails.get(self.root_rank % self.nproc_per_node, ""))


def _block(owner: str, tail: str) -> str:
    """``tail`` as an indented block headed "last lines of OWNER stderr", on a new line; empty for no tail."""
    return f"\n  last lines of {owner} stderr:\n    " + tail.replace("\n", "\n    ") if tail else ""


def then_failed(ranks: Sequence[int]) -> str:
    """`` (then rank(s) [0, 2] failed too)`` for the other failed ranks; empty when there are none."""
    return f" (then rank(s) {sorted(ranks)} failed too)" if ranks else ""


def seconds_text(seconds: float) -> str:
    """A deadline as a failure report writes it: ``30``, ``0.5``, ``900``."""
    return f"{seconds:g}"
