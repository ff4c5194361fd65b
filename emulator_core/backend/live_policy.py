"""What the live backend (``nbox emulate``, :mod:`emulator_core.backend`) can play of a scenario.

Its own module, not the backend's, so that ``nbox emulate`` refuses a scenario before it starts any rank
(the backend imports torch; this does not).
"""

from __future__ import annotations

from emulator_core.scenario import Scenario

__all__ = ["live_unsupported"]


def live_unsupported(scenario: Scenario) -> str | None:
    """Why the live backend cannot play ``scenario`` (``None`` when it can).

    The backend answers collectives while the script's real compute runs at its real speed, so the
    scenario keys that change compute (``compute_scale``) or the overlap of compute with communication
    (``overlap = "serialize"``) have nothing to act on; refused rather than silently ignored. ``nbox replay``
    applies both. A what-if mesh (``[mesh]``) is refused too: the script builds its own mesh from the world size
    it sees, and a live replay plays the recorded groups (``nbox replay --clock virtual`` plays a mesh).
    """
    if scenario.mesh:
        mesh = ",".join(f"{n}={d}" for n, d in scenario.mesh)
        return (f"mesh {mesh}: a what-if mesh is played by nbox replay --clock virtual only; the live emulation "
                f"runs at a world size (give --world-size; a script builds its mesh from it): remove the mesh from "
                f"the scenario")
    bad = []
    if scenario.compute_scale != 1.0:
        bad.append(f"compute_scale = {scenario.compute_scale:g}")
    if scenario.overlap != "overlap":
        bad.append(f'overlap = "{scenario.overlap}"')
    if not bad:
        return None
    return (f"{' and '.join(bad)}: the live emulation runs the script's real compute, so it cannot apply "
            f"{'these' if len(bad) > 1 else 'this'} (nbox replay can); remove {'them' if len(bad) > 1 else 'it'} "
            f"from the scenario")

