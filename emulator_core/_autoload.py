"""Register the ``nbox`` torch.distributed backend when torch is imported (the ``torch.backends`` entry point).

torch calls every ``torch.backends`` entry point at the end of ``import torch``
(``torch._import_device_backends``; ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns that off). This only
registers the name: the backend module (:mod:`emulator_core.backend`) is imported when a process group is
created with ``backend="nbox"``. It never raises: a failure here would break ``import torch`` for every
program in the environment, so it warns instead.
"""

from __future__ import annotations

import warnings
from typing import Any

BACKEND_NAME = "nbox"


def _create(opts: Any, backend_options: Any) -> Any:
    from emulator_core.backend import create_process_group

    return create_process_group(opts, backend_options)


def register() -> None:
    """Register ``nbox`` with ``torch.distributed.Backend`` (idempotent; warns instead of raising)."""
    try:
        import torch.distributed as dist

        if not dist.is_available() or BACKEND_NAME in dist.Backend.backend_list:
            return
        dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])
    except Exception as err:
        warnings.warn(f"nbox: could not register the 'nbox' torch.distributed backend: {err}", stacklevel=1)
