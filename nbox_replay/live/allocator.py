"""A steady host heap for the processes that re-execute operators (live replay, live measurement).

PyTorch's CPU tensors come from ``posix_memalign`` (glibc's malloc on Linux). glibc serves a block above its
mmap threshold with a fresh ``mmap`` and gives it back on free, and returns the free top of its heap to the
kernel once it passes the trim threshold; either way the next tensor of that size touches new pages, and every
4 KiB page costs a minor page fault the first time it is written. A replay worker re-runs the same operators with
the same sizes over and over, but through a pool that frees each output at its recorded last use
(:class:`nbox_replay.live.ops.TensorPool`), in an order the real training process did not have: on ddp_transformer the
operators of one
captured iteration took hundreds of minor faults and measurably longer than with the heap held, more faults than
the real training loop of the same model takes per step (docs/results.md, "Smaller measurements").

The replay's compute is meant to cost what the operators cost, and the real thread's own extras (its faults,
the autograd engine, Python) are put back by the host-work pad (:mod:`nbox_replay.live.hostwork`), which can only
stretch a replay that runs faster than the real thread, never shrink one that runs slower. So the workers hold
the heap: :func:`hold_heap` fixes the mmap threshold at glibc's own ceiling for its dynamic threshold
(``DEFAULT_MMAP_THRESHOLD_MAX``, 32 MiB on 64-bit: a block that large is mapped in the real process too, so it
faults in both) and turns trimming off (``M_TRIM_THRESHOLD``), through ``mallopt(3)``. The process keeps the
memory it freed (its peak, which the replay reaches in its first repetition anyway).

Nothing is done on a C library that is not glibc (musl, macOS), with another allocator preloaded (jemalloc,
tcmalloc: ``LD_PRELOAD`` names it; they keep their own caches), or when ``mallopt`` refuses; the reason is
returned, and the worker reports it.
"""

from __future__ import annotations

import ctypes
import os
import platform

__all__ = ["MMAP_THRESHOLD_BYTES", "hold_heap"]

#: glibc's ``mallopt`` parameter numbers (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

#: The mmap threshold set: glibc's ``DEFAULT_MMAP_THRESHOLD_MAX`` on 64-bit (``4 * 1024 * 1024 * sizeof(long)``),
#: the most its dynamic threshold grows to and the most ``mallopt`` accepts.
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024

#: The trim threshold set: the largest int ``mallopt`` takes (about 2 GiB of free heap top kept).
_TRIM_THRESHOLD_BYTES = 2**31 - 1


def hold_heap() -> str:
    """Fix glibc's mmap threshold and stop heap trimming in this process (module docstring).

    Returns:
        '' when done, else why not (one line). Never raises.
    """
    preload = os.environ.get("LD_PRELOAD", "")
    if any(name in preload for name in ("jemalloc", "tcmalloc", "mimalloc")):
        return f"another allocator is preloaded (LD_PRELOAD={preload})"
    libc_name, _ = platform.libc_ver()
    if libc_name != "glibc":
        return f"the C library is not glibc ({libc_name or platform.system()})"
    try:  # the process's own symbols: glibc's mallopt, without find_library's ldconfig subprocess
        mallopt = ctypes.CDLL(None).mallopt
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        if mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) != 1:
            return f"mallopt(M_MMAP_THRESHOLD, {MMAP_THRESHOLD_BYTES}) refused"
        if mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES) != 1:
            return f"mallopt(M_TRIM_THRESHOLD, {_TRIM_THRESHOLD_BYTES}) refused"
    except Exception as err:  # never fatal: a worker without a held heap still replays (and says so)
        return f"glibc's mallopt is not reachable: {type(err).__name__}: {err}"
    return ""
