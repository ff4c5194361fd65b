"""nbox_replay: trace scheduler, compute re-execution, reports, timelines and sweeps.

Empty for now: ``nbox replay`` does not exist yet (the replay issue builds it). It never imports
``nbox_record``.
"""
