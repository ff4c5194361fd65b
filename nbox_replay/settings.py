"""Replay settings given as ``--set replay.<key>=<value>`` beside the scenario's own keys.

Some choices of a replay are corrections a user rarely needs to change (how recorded compute sheds the profiler's
overhead, whether a live replay pads for host work it does not re-run). They have good defaults and no flag of
their own; a user who must change one says so with ``--set``, like any other setting of the question:

* ``replay.profiler_correction``: ``on`` (default), ``off``, ``proportional``, ``per_op``, ``to_clean``, ``to_wall``
  (:mod:`nbox_replay.inputs.profiler`);
* ``replay.host_work``: ``pad`` (default with live compute), ``match``, ``off`` (:mod:`nbox_replay.live.hostwork`).

:func:`split_settings` takes them out of the overrides; the rest go to the scenario as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from nbox_trace.errors import UsageError

__all__ = ["HOST_WORK", "PREFIX", "PROFILER_CORRECTION", "split_settings"]

#: The key prefix of a replay setting.
PREFIX = "replay."
#: ``--set replay.profiler_correction=MODE``.
PROFILER_CORRECTION = "replay.profiler_correction"
#: ``--set replay.host_work=MODE``.
HOST_WORK = "replay.host_work"


def split_settings(overrides: Iterable[str], allowed: Sequence[str] = (PROFILER_CORRECTION, HOST_WORK),
                   ) -> tuple[tuple[str, ...], dict[str, str]]:
    """The scenario's overrides, and the replay settings (``replay.<key>`` -> value, the last one given wins).

    Raises:
        UsageError: a ``replay.`` key that is not one of ``allowed`` (the message lists them), or an empty value.
    """
    scenario: list[str] = []
    settings: dict[str, str] = {}
    for text in overrides:
        key, _, value = text.partition("=")
        key, value = key.strip(), value.strip().strip("\"'")
        if not key.startswith(PREFIX):
            scenario.append(text)
            continue
        if key not in allowed:
            raise UsageError(f"--set {text}: unknown replay setting (known here: {', '.join(allowed)})")
        if not value:
            raise UsageError(f"--set {text}: give a value, e.g. {key}=off")
        settings[key] = value
    return tuple(scenario), settings
