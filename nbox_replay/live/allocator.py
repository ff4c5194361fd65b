"""A steady host heap for the processes that re-execute operators (live replay, live measurement).

:func:`hold_heap` sets glibc's malloc, through ``mallopt(3)``, so that freed tensor memory is reused rather than given
back to the kernel: the mmap threshold fixed at glibc's ceiling for its dynamic threshold (``M_MMAP_THRESHOLD`` =
``DEFAULT_MMAP_THRESHOLD_MAX``, 32 MiB on 64-bit: a block that large is mapped in the real process too) and trimming
off (``M_TRIM_THRESHOLD``). The process keeps the memory it freed (its peak, which the replay reaches in its first
repetition anyway), and a re-run operator touches no new pages the real run did not.

Nothing is done on a C library that is not glibc (musl, macOS), with another allocator preloaded (jemalloc,
tcmalloc: ``LD_PRELOAD`` names it; they keep their own caches), or when ``mallopt`` refuses; the reason is returned,
and the worker reports it (``heap_not_held``). Why the heap is held: docs/design/live-replay.md.
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
