"""nbox_record: launcher, capture and conversion to Chakra ET (``nbox record``).

``step()`` is the documented one-line iteration marker for scripts that never step a
``torch.optim`` optimizer: call ``nbox_record.step()`` once per iteration. It does nothing unless
the process is being recorded. This package never imports ``nbox_replay``.
"""

from nbox_record.marker import step

__all__ = ["step"]
