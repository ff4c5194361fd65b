"""nbox_replay: replay a recorded trace, in virtual time or live on this machine, under what-if scenarios.

Rooms, bottom to top: ``inputs`` (what a replay reads), ``virtual`` (simulated time), ``report`` (the run summary,
report, timelines) and ``live`` (the real clock). On them: ``nbox replay`` (:mod:`nbox_replay.replay`; what it
was asked, :class:`~nbox_replay.settings.ReplayConfig`, in :mod:`nbox_replay.settings`) and ``nbox sweep``
(:mod:`nbox_replay.sweep`, its outputs in :mod:`nbox_replay.sweep_outputs`). Each room's ``__init__`` is its door.
It imports ``emulator_core`` and ``nbox_trace``, never ``nbox_record``.
"""
