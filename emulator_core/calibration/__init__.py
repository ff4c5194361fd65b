"""``nbox calibrate``: measure the real collectives on N local ranks and fit the cost model.

The command's library (``pipeline``: :func:`calibrate`), its settings and measured points (``spec``), the sizes a
recorded job moves (``from_bundle``, for ``--sizes-from``), the measuring run that launches
``python -m emulator_core.calibration._worker`` on N ranks (``run``), the fit (``fit``) and the fit of nccl-tests
output (``nccl_calibrate``).

May import: ``emulator_core.pricing``, ``emulator_core.scenario``, ``emulator_core.network`` and ``nbox_trace``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbox_trace.doors import load

#: Each exported name by the module of this room that defines it (imported on first use: nbox_trace.doors).
_HOMES: dict[str, tuple[str, ...]] = {
    "pipeline": ("calibrate", "format_fits"),
    "nccl_calibrate": ("NcclTestsConfig", "base_scenario", "calibrate_nccl_tests", "compare", "format_rows",
        "row_dict", "summary"),
    "spec": ("CalibrateConfig", "parse_size", "parse_sizes"),
    "from_bundle": ("job_sizes",),
}

__all__ = ["CalibrateConfig", "NcclTestsConfig", "base_scenario", "calibrate", "calibrate_nccl_tests", "compare",
    "format_fits", "format_rows", "job_sizes", "parse_size", "parse_sizes", "row_dict", "summary"]

if TYPE_CHECKING:
    from emulator_core.calibration.from_bundle import job_sizes
    from emulator_core.calibration.nccl_calibrate import (
        NcclTestsConfig,
        base_scenario,
        calibrate_nccl_tests,
        compare,
        format_rows,
        row_dict,
        summary,
    )
    from emulator_core.calibration.pipeline import calibrate, format_fits
    from emulator_core.calibration.spec import CalibrateConfig, parse_size, parse_sizes
else:
    def __getattr__(name: str) -> object:
        return load(__name__, _HOMES, name)
