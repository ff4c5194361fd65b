"""The ``NBOX_*`` environment contract between ``nbox record``'s launcher and the in-rank bootstrap.

The launcher builds it with :func:`record_env`; each rank reads it with :func:`config_from_env`,
which names the bad variable in its error. Imports nothing heavy (no torch).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from nbox_trace.launch import python_path

ENV_DIR = "NBOX_RECORD_DIR"
ENV_WARMUP = "NBOX_WARMUP"
ENV_ITERATIONS = "NBOX_ITERATIONS"
ENV_CAPTURE = "NBOX_CAPTURE"
#: Iterations profiled by Kineto alone just before the capture (operator times without the ET observer's cost,
#: :mod:`nbox_record.sources.leantiming`); 0: none.
ENV_LEAN = "NBOX_LEAN_ITERATIONS"
ENV_RUN_TO_END = "NBOX_RUN_TO_END"
ENV_BOUNDARY_TIMEOUT = "NBOX_BOUNDARY_TIMEOUT_S"
ENV_EXIT_BARRIER_TIMEOUT = "NBOX_EXIT_BARRIER_TIMEOUT_S"
#: "1": time the iterations only (no ET observer, no Kineto); stop after the timed ones (``nbox emulate``).
ENV_NO_CAPTURE = "NBOX_NO_CAPTURE"
#: "1": redirect the script's ``init_process_group`` / ``new_group`` backend to ``nbox`` (``nbox emulate``).
ENV_EMULATE = "NBOX_EMULATE"
#: Set by :func:`install` to the recording process's pid, so that its children do not record.
ENV_OWNER = "NBOX_RECORD_OWNER_PID"

class ConfigError(ValueError):
    """A bad ``NBOX_*`` environment variable; the message names it."""


@dataclass(frozen=True)
class Config:
    record_dir: Path
    warmup: int = 3
    iterations: int = 10
    capture: int = 1
    lean: int = 0
    run_to_end: bool = False
    boundary_timeout_s: float = 120.0
    exit_barrier_timeout_s: float = 60.0
    no_capture: bool = False
    emulate: bool = False

    @property
    def effective_warmup(self) -> int:
        """At least one iteration is skipped: the first has no boundary to start its clock."""
        return max(self.warmup, 1)

    @property
    def effective_capture(self) -> int:
        """Captured iterations run: none without a capture."""
        return 0 if self.no_capture else self.capture

    @property
    def effective_lean(self) -> int:
        """Lean iterations run: none without a capture."""
        return 0 if self.no_capture else self.lean

    @property
    def needed(self) -> int:
        """Iteration boundaries the rank needs: warm-up + timed + lean + captured (timed only without a capture)."""
        return self.effective_warmup + self.iterations + self.effective_lean + self.effective_capture


def _int_env(env: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: not an integer") from None
    if value < minimum:
        raise ConfigError(f"{name}={value}: must be >= {minimum}")
    return value


def _seconds_env(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name}={raw!r}: must be a positive number of seconds")
    return value


def config_from_env(env: Mapping[str, str] | None = None) -> Config:
    """Read the configuration; raises :class:`ConfigError` naming the bad variable."""
    env = os.environ if env is None else env
    record_dir = env.get(ENV_DIR, "")
    if not record_dir:
        raise ConfigError(f"{ENV_DIR} is not set")
    flags = {}
    for name in (ENV_RUN_TO_END, ENV_NO_CAPTURE, ENV_EMULATE):
        value = env.get(name, "").strip()
        if value not in ("", "0", "1"):
            raise ConfigError(f"{name}={value!r}: use 1 or 0")
        flags[name] = value == "1"
    return Config(
        record_dir=Path(record_dir),
        warmup=_int_env(env, ENV_WARMUP, 3, 0),
        iterations=_int_env(env, ENV_ITERATIONS, 10, 1),
        capture=_int_env(env, ENV_CAPTURE, 1, 1),
        lean=_int_env(env, ENV_LEAN, 0, 0),
        run_to_end=flags[ENV_RUN_TO_END],
        boundary_timeout_s=_seconds_env(env, ENV_BOUNDARY_TIMEOUT, 120.0),
        exit_barrier_timeout_s=_seconds_env(env, ENV_EXIT_BARRIER_TIMEOUT, 60.0),
        no_capture=flags[ENV_NO_CAPTURE],
        emulate=flags[ENV_EMULATE],
    )


def inject_dir() -> Path:
    """The folder to put first on ``PYTHONPATH``: it holds nbox's ``sitecustomize.py``."""
    return Path(__file__).resolve().parents[1] / "_inject"


def record_env(
    record_dir: str | os.PathLike[str],
    *,
    warmup: int = 3,
    iterations: int = 10,
    capture: int = 1,
    lean: int = 0,
    run_to_end: bool = False,
    boundary_timeout_s: float = 120.0,
    pythonpath: str | None = None,
    no_capture: bool = False,
    emulate: bool = False,
) -> dict[str, str]:
    """The environment variables a launcher adds for the ranks (:mod:`nbox_trace.launch`).

    ``PYTHONPATH`` = the inject folder, the folder holding ``nbox_record`` (so a non-installed checkout
    works; skipped for an installed nbox), then ``pythonpath`` (pass the caller's own ``PYTHONPATH`` to
    keep it). Threads are the caller's business: on CPU set ``OMP_NUM_THREADS=1`` per rank (torchrun
    does when it is unset).
    """
    return {
        ENV_DIR: str(Path(record_dir).resolve()),
        ENV_WARMUP: str(warmup),
        ENV_ITERATIONS: str(iterations),
        ENV_CAPTURE: str(capture),
        ENV_LEAN: str(lean),
        ENV_RUN_TO_END: "1" if run_to_end else "0",
        ENV_BOUNDARY_TIMEOUT: repr(float(boundary_timeout_s)),
        ENV_NO_CAPTURE: "1" if no_capture else "0",
        ENV_EMULATE: "1" if emulate else "0",
        "PYTHONPATH": python_path([str(inject_dir())], pythonpath),
    }
