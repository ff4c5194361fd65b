"""The device hold on CUDA: the one module of nbox that touches CUDA for it (the logic is
:mod:`emulator_core.device.hold`, tested against a fake device; this module implements its protocol).

The kernels (:data:`KERNELS`, CUDA C, one thread each):

* ``nbox_hold(slot, timeout_ns, hold)`` stamps ``%globaltimer`` (the GPU's nanosecond timer) into the slot unless a
  stamp went first (the collective's arrival as the device sees it); with ``hold`` it then spins, reading the
  deadline from the slot (pinned host memory) until the host has written one, then on its own timer until the
  deadline; it ends early after ``timeout_ns`` or on the slot's abort word, and writes its end time and status. The
  stream's next operations wait for it, as for an NCCL kernel.
* ``nbox_clock(cal, samples, timeout_ns)`` stamps the timer at each of the host's go words, for
  :meth:`CudaDevice.clock_samples` to bracket with host reads.

They are compiled at run time with NVRTC (the torch CUDA wheel's ``nvidia-cuda-nvrtc``) through ctypes, loaded into
the device's primary context and launched with ``cuModuleLoadData`` / ``cuLaunchKernel`` on the stream the engine
chose: no C compiler, no CUDA toolkit, no new package. Where any of this is missing (a ROCm build, no NVRTC library,
a compile error), :class:`CudaHoldUnavailable` says why, and the backend holds on the host
(``NBOX_DEVICE_HOLD=auto``, said once) or refuses (``=on``). Slots are :data:`WORDS` int64 words in pinned host memory
(start, deadline, abort, status, released; -1 or 0 until written), in rings of :data:`RING_SLOTS`; a slot goes back
to its ring once its hold has ended. Why: docs/design/device-hold.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from emulator_core.device.hold import UNSET_NS, Event, HoldError, Slot, Stream

__all__ = ["KERNELS", "CudaDevice", "CudaHoldUnavailable"]

KERNELS = r"""
typedef long long i64;
__device__ __forceinline__ i64 nbox_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return (i64)t;
}
/* slot words: 0 start, 1 deadline, 2 abort, 3 status (0 pending, 1 released, 2 timed out, 3 aborted), 4 released */
extern "C" __global__ void nbox_hold(volatile i64* slot, i64 timeout_ns, int hold) {
    i64 start = nbox_now();
    if (slot[0] == -1) { slot[0] = start; __threadfence_system(); }
    if (!hold) return;
    i64 deadline = -1, now = start;
    int status = 0;
    unsigned int n = 0;
    while (status == 0) {
        now = nbox_now();
        if (deadline == -1) deadline = slot[1];
        if (deadline != -1 && now >= deadline) status = 1;
        else if (now - start >= timeout_ns) status = 2;
        else if ((++n & 15u) == 0u && slot[2] != 0) status = 3;
    }
    slot[4] = now;
    __threadfence_system();
    slot[3] = status;
    __threadfence_system();
}
/* cal words: 0 state (0 launched, 1 running, 2 timed out); sample i: 1 + 2i the host's go, 2 + 2i the stamp */
extern "C" __global__ void nbox_clock(volatile i64* cal, int samples, i64 timeout_ns) {
    i64 start = nbox_now();
    cal[0] = 1;
    __threadfence_system();
    for (int i = 0; i < samples; ++i) {
        while (cal[1 + 2 * i] == 0) {
            if (nbox_now() - start > timeout_ns) { cal[0] = 2; __threadfence_system(); return; }
        }
        cal[2 + 2 * i] = nbox_now();
        __threadfence_system();
    }
}
"""

WORDS = 8
RING_SLOTS = 4096
CLOCK_SAMPLES_MAX = 64
CLOCK_TIMEOUT_NS = 1_000_000_000


class CudaHoldUnavailable(HoldError):
    """The hold kernel cannot be built or run here (the message says why)."""


_KERNELS: dict[int, tuple[Any, Any]] = {}  # by device: a module is loaded into one device's context
_BUILD_LOCK = threading.Lock()


def _load(names: list[str], what: str) -> Any:
    """The first of ``names`` (a soname, or a path) that loads."""
    errors = []
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError as err:
            errors.append(str(err))
    raise CudaHoldUnavailable(f"no {what} library ({'; '.join(errors[-2:])})")


def _nvrtc_library() -> Any:
    """NVRTC: by soname (loaded already by torch, or on the library path), else from the nvidia wheels' folders or
    a CUDA toolkit's."""
    major = str(torch.version.cuda or "").split(".")[0]
    names = [f"libnvrtc.so.{major}", "libnvrtc.so"]
    for entry in sys.path:
        names += sorted(str(p) for p in Path(entry).glob("nvidia/*/lib/libnvrtc.so*"))
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            names += sorted(str(p) for p in Path(home).glob("lib*/libnvrtc.so*"))
    return _load(names, "NVRTC")


def _nvrtc(lib: Any, rc: int, what: str) -> None:
    if rc != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        text = lib.nvrtcGetErrorString(rc)
        raise CudaHoldUnavailable(f"NVRTC {what} failed: {text.decode() if text else rc}")


def _compile(major: int, minor: int) -> bytes:
    """The kernels as a cubin for ``sm_<major><minor>``, or as PTX for the driver to finish where this NVRTC
    does not know the architecture."""
    lib = _nvrtc_library()
    last = ""
    for arch, binary in ((f"sm_{major}{minor}", "CUBIN"), (f"compute_{major}{minor}", "PTX")):
        prog = ctypes.c_void_p()
        _nvrtc(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), KERNELS.encode(), b"nbox_hold.cu", 0, None, None),
               "create")
        try:
            opts = (ctypes.c_char_p * 1)(f"--gpu-architecture={arch}".encode())
            if lib.nvrtcCompileProgram(prog, 1, opts) != 0:
                size = ctypes.c_size_t()
                lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
                log = ctypes.create_string_buffer(size.value)
                lib.nvrtcGetProgramLog(prog, log)
                last = f"{arch}: {log.value.decode(errors='replace').strip()[:300]}"
                continue
            size = ctypes.c_size_t()
            _nvrtc(lib, getattr(lib, f"nvrtcGet{binary}Size")(prog, ctypes.byref(size)), f"get {binary} size")
            out = ctypes.create_string_buffer(size.value)
            _nvrtc(lib, getattr(lib, f"nvrtcGet{binary}")(prog, out), f"get {binary}")
            return out.raw
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))
    raise CudaHoldUnavailable(f"the hold kernel did not compile ({last})")


def _kernels(driver: Any, ctx: ctypes.c_void_p, index: int) -> tuple[Any, Any]:
    """The two kernels' function handles, compiled and loaded into device ``index``'s primary context once."""
    if torch.version.hip:
        raise CudaHoldUnavailable("a ROCm build of torch: the hold kernel reads NVIDIA's %globaltimer")
    with _BUILD_LOCK:
        got = _KERNELS.get(index)
        if got is None:
            binary = _compile(*torch.cuda.get_device_capability(index))
            module, hold, clock = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
            if driver.cuCtxSetCurrent(ctx) or driver.cuModuleLoadData(ctypes.byref(module), binary) or \
                    driver.cuModuleGetFunction(ctypes.byref(hold), module, b"nbox_hold") or \
                    driver.cuModuleGetFunction(ctypes.byref(clock), module, b"nbox_clock"):
                raise CudaHoldUnavailable(f"the hold kernel could not be loaded on device {index}")
            got = _KERNELS[index] = (hold, clock)
        return got


class _Ring:
    """:data:`RING_SLOTS` slots of :data:`WORDS` int64 words in one pinned host buffer."""

    def __init__(self) -> None:
        self.tensor = torch.full((RING_SLOTS * WORDS,), -1, dtype=torch.int64).pin_memory()
        self.words = (ctypes.c_int64 * (RING_SLOTS * WORDS)).from_address(self.tensor.data_ptr())
        self.free = list(range(RING_SLOTS - 1, -1, -1))


class CudaSlot:
    """One slot: word ``base + k`` of its ring (see :data:`KERNELS` for the words)."""

    def __init__(self, ring: _Ring, index: int, lock: threading.Lock) -> None:
        self.ring, self.index, self.lock = ring, index, lock
        self.base = index * WORDS
        self.pointer = ring.tensor.data_ptr() + self.base * 8
        w = ring.words
        w[self.base], w[self.base + 1], w[self.base + 2] = UNSET_NS, UNSET_NS, 0
        w[self.base + 3], w[self.base + 4] = 0, UNSET_NS

    def read_start_ns(self) -> int:
        return int(self.ring.words[self.base])

    def read_status(self) -> int:
        return int(self.ring.words[self.base + 3])

    def read_released_ns(self) -> int:
        return int(self.ring.words[self.base + 4])

    def write_deadline_ns(self, deadline_device_ns: int) -> None:
        self.ring.words[self.base + 1] = max(0, deadline_device_ns)

    def write_abort(self) -> None:
        self.ring.words[self.base + 2] = 1

    def free(self) -> None:
        with self.lock:
            self.ring.free.append(self.index)


class CudaEvent:
    def __init__(self, raw: torch.cuda.Event) -> None:
        self.raw = raw

    def query(self) -> bool:
        return bool(self.raw.query())  # type: ignore[no-untyped-call]


class CudaStream:
    def __init__(self, raw: torch.cuda.Stream) -> None:
        self.raw = raw

    def record_event(self) -> CudaEvent:
        ev = torch.cuda.Event()  # type: ignore[no-untyped-call]
        ev.record(self.raw)
        return CudaEvent(ev)

    def wait_event(self, event: Event) -> None:
        assert isinstance(event, CudaEvent)
        self.raw.wait_event(event.raw)


class CudaDevice:
    """One GPU as :class:`emulator_core.device.hold.Device` (module docstring)."""

    def __init__(self, index: int) -> None:
        if not torch.cuda.is_available():
            raise CudaHoldUnavailable("CUDA is not available")
        self.index = index
        self._driver = _load(["libcuda.so.1", "libcuda.so"], "CUDA driver")
        torch.cuda.init()  # type: ignore[no-untyped-call]  # the driver is initialized: cuInit ran
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        if self._driver.cuDeviceGet(ctypes.byref(dev), index) or \
                self._driver.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev):
            raise CudaHoldUnavailable(f"no CUDA context for device {index}")
        self._ctx = ctx  # set current before each launch: the caller may be a thread that never used the driver API
        self._hold, self._clock_kernel = _kernels(self._driver, ctx, index)
        self._rings: list[_Ring] = []
        self._lock = threading.Lock()
        self._cal = torch.zeros(1 + 2 * CLOCK_SAMPLES_MAX, dtype=torch.int64).pin_memory()
        self._cal_words = (ctypes.c_int64 * self._cal.numel()).from_address(self._cal.data_ptr())
        self._cal_done: CudaEvent | None = None
        self._cal_stream = CudaStream(torch.cuda.Stream(device=index, priority=-1))  # type: ignore[no-untyped-call]

    def _launch(self, func: Any, stream: Stream, args: list[Any]) -> None:
        assert isinstance(stream, CudaStream)
        if self._driver.cuCtxSetCurrent(self._ctx):
            raise HoldError(f"the CUDA context of device {self.index} could not be made current")
        params = (ctypes.c_void_p * len(args))(*(ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in args))
        rc = self._driver.cuLaunchKernel(func, 1, 1, 1, 1, 1, 1, 0, ctypes.c_void_p(stream.raw.cuda_stream),
                                         params, None)
        if rc != 0:
            raise HoldError(f"the hold kernel could not be launched on device {self.index} (CUDA driver error {rc})")

    # -- the Device protocol -------------------------------------------------------------------------------
    def current_stream(self) -> CudaStream:
        return CudaStream(torch.cuda.current_stream(self.index))

    def new_stream(self) -> CudaStream:
        return CudaStream(torch.cuda.Stream(device=self.index))  # type: ignore[no-untyped-call]

    def use_stream(self, stream: Stream) -> contextlib.AbstractContextManager[None]:
        assert isinstance(stream, CudaStream)
        return torch.cuda.stream(stream.raw)

    def synchronize(self, stream: Stream) -> None:
        assert isinstance(stream, CudaStream)
        stream.raw.synchronize()

    def is_capturing(self) -> bool:
        return bool(torch.cuda.is_current_stream_capturing())

    def new_slot(self) -> CudaSlot:
        with self._lock:
            ring = next((r for r in self._rings if r.free), None)
            if ring is None:
                ring = _Ring()
                self._rings.append(ring)
            return CudaSlot(ring, ring.free.pop(), self._lock)

    def stamp(self, stream: Stream, slot: Slot) -> None:
        assert isinstance(slot, CudaSlot)
        self._launch(self._hold, stream, [ctypes.c_void_p(slot.pointer), ctypes.c_longlong(0), ctypes.c_int(0)])

    def enqueue_hold(self, stream: Stream, slot: Slot, timeout_ns: int) -> CudaEvent:
        assert isinstance(slot, CudaSlot) and isinstance(stream, CudaStream)
        self._launch(self._hold, stream, [ctypes.c_void_p(slot.pointer), ctypes.c_longlong(timeout_ns),
                                          ctypes.c_int(1)])
        return stream.record_event()

    def future_scope(self, stream: Stream) -> tuple[list[str], contextlib.AbstractContextManager[None]]:
        return [f"cuda:{self.index}"], self.use_stream(stream)

    def clock_samples(self, n: int, host_now_ns: Callable[[], int]) -> list[tuple[int, int, int]]:
        """Bracketed reads of ``%globaltimer`` (module docstring), on a high-priority stream of their own."""
        n = max(1, min(n, CLOCK_SAMPLES_MAX))
        if self._cal_done is not None and not self._cal_done.query():
            raise HoldError("the previous device clock measurement is still running")
        w = self._cal_words
        for k in range(1 + 2 * n):
            w[k] = 0
        self._launch(self._clock_kernel, self._cal_stream,
                     [ctypes.c_void_p(self._cal.data_ptr()), ctypes.c_int(n), ctypes.c_longlong(CLOCK_TIMEOUT_NS)])
        self._cal_done = self._cal_stream.record_event()
        give_up = time.monotonic() + CLOCK_TIMEOUT_NS / 1e9
        while w[0] == 0 and time.monotonic() < give_up:
            time.sleep(50e-6)
        reads = []
        try:
            if w[0] != 1:
                raise HoldError("the device clock kernel did not start (the GPU is busy); offset kept")
            for i in range(n):
                before = host_now_ns()
                w[1 + 2 * i] = 1
                while w[2 + 2 * i] == 0:
                    if w[0] == 2 or time.monotonic() > give_up:
                        raise HoldError("the device clock kernel timed out")
                reads.append((before, int(w[2 + 2 * i]), host_now_ns()))
        finally:
            for i in range(n):  # let an abandoned kernel finish at once
                w[1 + 2 * i] = 1
        return reads
