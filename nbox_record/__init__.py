"""nbox_record: launcher, capture and conversion to Chakra ET (``nbox record``, ``nbox emulate``).

Rooms, bottom to top: ``examples`` (built-in workloads), ``handoff`` (what the launcher and its ranks agree on),
``sources`` (reading what a rank recorded), ``convert`` (to Chakra), ``capture`` (inside each rank; started by
``_inject``) and ``launch`` (the launcher side of record and emulate). Each room's ``__init__`` is its door.

``step()`` is the documented one-line iteration marker for scripts that never step a
``torch.optim`` optimizer: call ``nbox_record.step()`` once per iteration. It does nothing unless
the process is being recorded. This package never imports ``nbox_replay``.
"""

from nbox_record.marker import step

__all__ = ["step"]
