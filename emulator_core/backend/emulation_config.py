"""The emulated world a ``nbox`` backend process plays, read from its environment (see :mod:`emulator_core.backend`,
whose module docstring lists the variables). No torch: validated before any process group exists."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from emulator_core.backend.live_policy import live_unsupported
from emulator_core.scenario import Scenario, load_scenario, resize
from nbox_trace.errors import InvalidInputError

__all__ = ["DEFAULT_SPIN_NS", "DEVICE_HOLDS", "EmulationConfig", "EmulationConfigError"]

#: The settings of ``NBOX_DEVICE_HOLD`` (:attr:`EmulationConfig.device_hold`).
DEVICE_HOLDS = ("auto", "on", "off")
#: How long before a deadline a waiting thread stops sleeping and spins (``NBOX_SPIN_US``;
#: :mod:`emulator_core.backend.delay`).
DEFAULT_SPIN_NS = 200_000


class EmulationConfigError(InvalidInputError):
    """The emulation settings (environment variables) are invalid; the message names the variable."""


@dataclass(frozen=True)
class EmulationConfig:
    """The emulated world, validated at construction.

    Attributes:
        world_size: W, the ranks the script sees.
        real_ranks: global rank of each real process, indexed by its real rank (0..N-1); distinct, < W.
        scenario: the what-if scenario, resized to W (its outermost dimension grows or shrinks).
        spin_ns: spin this long before a deadline (nanoseconds, >= 0).
        call_timeout_s: longest wait for one call's real part (seconds, > 0), when shorter than the
            process group's own timeout (``NBOX_CALL_TIMEOUT_S``; ``nbox emulate`` sets it, so a deadlock
            among real ranks ends with an error naming the call instead of torch's 30-minute default).
        move_data: move the tensors among the real members (``NBOX_MOVE_DATA``, default 1). ``nbox replay
            --clock real`` sets 0: its buffers carry no information, so only the arrival times travel (a
            collective's arrivals, a send's issue time to its receiver) and every call completes at the
            modeled time, not at the testbed's; a script run by ``nbox emulate`` needs its data and keeps 1.
        device_hold: where a call on CUDA tensors holds its delay (``NBOX_DEVICE_HOLD``, :data:`DEVICE_HOLDS`):
            ``auto`` on the device where the hold kernel builds, else on the host (said once); ``on`` on the
            device or not at all (an error); ``off`` on the host (:mod:`emulator_core.backend.devicecall`).
    """

    world_size: int
    real_ranks: tuple[int, ...]
    scenario: Scenario
    spin_ns: int = DEFAULT_SPIN_NS
    call_timeout_s: float = math.inf
    move_data: bool = True
    device_hold: str = "auto"

    def __post_init__(self) -> None:
        w = self.world_size
        if isinstance(w, bool) or not isinstance(w, int) or w < 1:
            raise EmulationConfigError(f"NBOX_WORLD_SIZE: must be an integer >= 1, got {w!r}")
        ranks = tuple(self.real_ranks)
        if not ranks:
            raise EmulationConfigError("NBOX_REAL_RANKS: needs at least one real rank")
        if len(set(ranks)) != len(ranks) or any(not 0 <= r < w for r in ranks):
            raise EmulationConfigError(f"NBOX_REAL_RANKS: {list(ranks)} must be distinct global ranks in 0..{w - 1}")
        object.__setattr__(self, "real_ranks", ranks)
        if self.scenario.world_size != w:
            raise EmulationConfigError(f"NBOX_SCENARIO: world size {self.scenario.world_size} != NBOX_WORLD_SIZE {w}")
        why = live_unsupported(self.scenario)
        if why:
            raise EmulationConfigError(f"NBOX_SCENARIO: {why}")
        if self.spin_ns < 0:
            raise EmulationConfigError(f"NBOX_SPIN_US: must be >= 0, got {self.spin_ns / 1000}")
        if not self.call_timeout_s > 0:
            raise EmulationConfigError(f"NBOX_CALL_TIMEOUT_S: must be > 0, got {self.call_timeout_s}")
        if self.device_hold not in DEVICE_HOLDS:
            raise EmulationConfigError(f"NBOX_DEVICE_HOLD: must be one of {', '.join(DEVICE_HOLDS)}, got "
                                       f"{self.device_hold!r}")

    @classmethod
    def from_env(cls, nproc: int, env: Mapping[str, str] | None = None) -> EmulationConfig:
        """Read the ``NBOX_*`` variables (module docstring) for a job of ``nproc`` real processes."""
        e = os.environ if env is None else env

        def integer(name: str, default: int) -> int:
            raw = e.get(name, "").strip()
            if not raw:
                return default
            try:
                return int(raw)
            except ValueError:
                raise EmulationConfigError(f"{name}: not an integer: {raw!r}") from None

        w = integer("NBOX_WORLD_SIZE", nproc)
        if w < 1:
            raise EmulationConfigError(f"NBOX_WORLD_SIZE: must be an integer >= 1, got {w}")
        raw_ranks = e.get("NBOX_REAL_RANKS", "").strip()
        try:
            ranks = tuple(int(x) for x in raw_ranks.split(",")) if raw_ranks else tuple(range(nproc))
        except ValueError:
            raise EmulationConfigError(f"NBOX_REAL_RANKS: not a comma-separated list of ranks: {raw_ranks!r}") from None
        if len(ranks) != nproc:
            raise EmulationConfigError(f"NBOX_REAL_RANKS: lists {len(ranks)} ranks but the job has {nproc} real "
                                       f"processes (WORLD_SIZE)")
        path = e.get("NBOX_SCENARIO", "").strip()
        overrides = [line for line in e.get("NBOX_SCENARIO_SET", "").splitlines() if line.strip()]
        scenario = load_scenario(Path(path) if path else None, overrides)
        try:
            scenario = resize(scenario, w)
        except InvalidInputError as err:
            raise EmulationConfigError(f"NBOX_WORLD_SIZE: {err}") from None
        spin_us = integer("NBOX_SPIN_US", DEFAULT_SPIN_NS // 1000)
        raw_timeout = e.get("NBOX_CALL_TIMEOUT_S", "").strip()
        try:
            call_timeout_s = float(raw_timeout) if raw_timeout else math.inf
        except ValueError:
            raise EmulationConfigError(f"NBOX_CALL_TIMEOUT_S: not a number: {raw_timeout!r}") from None
        raw_move = e.get("NBOX_MOVE_DATA", "").strip()
        if raw_move not in ("", "0", "1"):
            raise EmulationConfigError(f"NBOX_MOVE_DATA: must be 0 or 1, got {raw_move!r}")
        hold = e.get("NBOX_DEVICE_HOLD", "").strip().lower() or "auto"
        return cls(w, ranks, scenario, spin_us * 1000, call_timeout_s, raw_move != "0", hold)
