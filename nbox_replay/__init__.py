"""nbox_replay: replay a recorded trace, in virtual time or live on this machine, under what-if scenarios.

``nbox replay`` (:mod:`nbox_replay.replay`) and ``nbox sweep`` (:mod:`nbox_replay.sweep`); the virtual-time
engine (:mod:`nbox_replay.virtual`, on the event core :mod:`nbox_replay.events`), the live replay
(:mod:`nbox_replay.live`), the one run summary (:mod:`nbox_replay.summary`), the report and the Perfetto
timelines. It imports ``emulator_core`` and ``nbox_trace``, never ``nbox_record``.
"""
