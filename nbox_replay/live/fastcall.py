"""A replayed operator's cheapest Python entry: torch's generated binding, where it runs the same operators.

A live replay calls each recorded ``aten`` operator from Python; that call's own cost is the replay's, not the
workload's. ``OpOverload._op`` parses its arguments against the schema through the TorchScript stack machinery;
torch's generated bindings (``torch._C._VariableFunctions.mm``, ``torch.Tensor.view``, ``torch._C._nn.gelu``) parse
them with the faster generated parser.

A binding is picked by name and then **checked** (:func:`choose`), because it selects its overload by parsing the
arguments itself and may pick another one, or reject the schema's positional form (``ones_like``'s keyword-only
``dtype``): once, when the operator is prepared (:class:`nbox_replay.live.ops.Runnable`, before any repetition), both
entries run on ``meta`` tensors of its recorded shapes, strides and dtypes, built by a ``meta``
:class:`~nbox_replay.live.ops.TensorPool` (no data, no side effect; a device argument becomes ``meta`` too, and an
operator with neither keeps ``_op``), under a mode that records every ``aten`` overload they dispatch to; the binding
is used only when it dispatches exactly the same overloads, in the same order, and returns outputs of the same
shapes, strides and dtypes. Anything else (no binding of that name, an error on either side, an operator without a
``meta`` kernel) keeps ``_op``. Why: docs/design/live-replay.md.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["bindings", "choose"]

#: torch's generated binding namespaces, searched in this order (``torch.Tensor`` methods last).
_NAMESPACES: tuple[Any, ...] = tuple(ns for ns in (
    torch._C._VariableFunctions, getattr(torch._C, "_nn", None), getattr(torch._C, "_linalg", None),
    getattr(torch._C, "_special", None), getattr(torch._C, "_fft", None)) if ns is not None)


class _Dispatched(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records the overloads dispatched under it and runs them (on ``meta`` tensors: shapes only)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch (2.6 and later) otherwise wraps __torch_dispatch__ in a dynamo-disable whose first call imports
        # torch._dynamo: 3-6 s of a live worker's first repetition on this VM, for a mode that compiles nothing.
        return False

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.seen: list[Any] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.seen.append(func)
        return func(*args, **(kwargs or {}))


def bindings(op: Any) -> list[Callable[..., Any]]:
    """torch's generated bindings named like ``op``'s operator (``aten::mm`` -> ``torch._C._VariableFunctions.mm``),
    in search order; a ``torch.Tensor`` method only when the schema's first argument is ``self``."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        return []
    ns, _, name = schema.name.partition("::")
    if ns != "aten" or not name:
        return []
    found = [f for f in (getattr(n, name, None) for n in _NAMESPACES) if callable(f)]
    args = list(schema.arguments)
    if args and args[0].name == "self":
        method = getattr(torch.Tensor, name, None)
        if callable(method):
            found.append(method)
    return found


def _meta(x: Any) -> Any:
    """A ``meta`` copy of an argument: tensors (same shape, strides, dtype) and devices (a factory operator then
    allocates nothing), inside lists and tuples too; anything else as it is."""
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype, device="meta")
    if isinstance(x, torch.device):
        return torch.device("meta")
    if isinstance(x, (list, tuple)):
        return type(x)(_meta(v) for v in x)
    return x


def _on_meta(x: Any) -> bool:
    """Whether ``x`` holds a tensor or a device (so that :func:`_meta` puts the call on ``meta``)."""
    if isinstance(x, (torch.Tensor, torch.device)):
        return True
    return isinstance(x, (list, tuple)) and any(_on_meta(v) for v in x)


def _trace(entry: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[list[Any], Any] | None:
    """The overloads ``entry`` dispatches to on ``meta`` copies of the arguments and its outputs' shapes, strides
    and dtypes; None when it raises."""
    mode = _Dispatched()
    try:
        meta_args, meta_kwargs = [_meta(a) for a in args], {k: _meta(v) for k, v in kwargs.items()}
        with warnings.catch_warnings(), torch.no_grad(), mode:
            warnings.simplefilter("ignore")  # a deprecated overload's notice: the entry is only being tried
            out = entry(*meta_args, **meta_kwargs)
        return mode.seen, _shape_of(out)
    except Exception:  # an entry that cannot take these arguments, or no meta kernel: not this entry
        return None


def _shape_of(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return ("T", tuple(x.shape), tuple(x.stride()), x.dtype)
    if isinstance(x, (list, tuple)):
        return tuple(_shape_of(v) for v in x)
    return type(x).__name__


def choose(op: Any, slow: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> Callable[..., Any]:
    """The entry to call ``op`` with from now on: the first of :func:`bindings` that dispatches the same overloads
    as ``slow`` (``op._op``) on these arguments and returns outputs of the same layout, else ``slow`` (module
    docstring). ``args`` and ``kwargs`` are the call's arguments, real or ``meta``; they are not touched.
    The first call in a process loads torch's meta kernels, which takes about a second; later ones are far
    cheaper."""
    if not _on_meta(list(args)) and not _on_meta(list(kwargs.values())):
        return slow  # it would run on a real device (a factory operator without a device): not checked, not changed
    want = _trace(slow, args, kwargs)
    if want is None or not want[0]:
        return slow
    for entry in bindings(op):
        if _trace(entry, args, kwargs) == want:
            return entry
    return slow
