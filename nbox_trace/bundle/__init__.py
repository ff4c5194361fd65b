"""The bundle format and what is done with bundles: write, pack, verify, inspect, diff, merge, anonymize.

The manifest, versions and migration (``manifest``), the ``.nbox`` archive (``archive``), and the commands
(``verify``, ``inspection``, ``diff``, ``merge``, ``anonymize``).

May import: ``nbox_trace.check``, ``nbox_trace.chakra`` and the base's own modules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbox_trace.doors import load

#: Each exported name by the module of this room that defines it (imported on first use: nbox_trace.doors).
_HOMES: dict[str, tuple[str, ...]] = {
    "anonymize": ("AnonymizeConfig", "LEVELS", "anonymize_bundle"),
    "archive": ("bundle_directory", "pack_bundle", "traces_directory", "unpack_bundle"),
    "diff": ("diff_bundles",),
    "inspection": ("inspect_bundle", "load_bundle"),
    "manifest": ("COMM_GROUP_NAME", "Manifest", "OBSERVED_RULE", "THREAD_CPU_KEY", "job_iterations_us", "locate_traces",
        "observed_iteration_us", "observed_summary", "thread_cpu_figures", "write_bundle"),
    "merge": ("merge_bundles",),
    "verify": ("verify_bundle",),
}

__all__ = ["AnonymizeConfig", "COMM_GROUP_NAME", "LEVELS", "Manifest", "OBSERVED_RULE", "THREAD_CPU_KEY",
    "anonymize_bundle", "bundle_directory", "diff_bundles", "inspect_bundle", "job_iterations_us", "load_bundle",
    "locate_traces", "merge_bundles", "observed_iteration_us", "observed_summary", "pack_bundle",
    "thread_cpu_figures", "traces_directory", "unpack_bundle", "verify_bundle", "write_bundle"]

if TYPE_CHECKING:
    from nbox_trace.bundle.anonymize import LEVELS, AnonymizeConfig, anonymize_bundle
    from nbox_trace.bundle.archive import bundle_directory, pack_bundle, traces_directory, unpack_bundle
    from nbox_trace.bundle.diff import diff_bundles
    from nbox_trace.bundle.inspection import inspect_bundle, load_bundle
    from nbox_trace.bundle.manifest import (
        COMM_GROUP_NAME,
        OBSERVED_RULE,
        THREAD_CPU_KEY,
        Manifest,
        job_iterations_us,
        locate_traces,
        observed_iteration_us,
        observed_summary,
        thread_cpu_figures,
        write_bundle,
    )
    from nbox_trace.bundle.merge import merge_bundles
    from nbox_trace.bundle.verify import verify_bundle
else:
    def __getattr__(name: str) -> object:
        return load(__name__, _HOMES, name)
