"""A room's public door, opened on first use: the names a sub-package's ``__init__`` exports, imported lazily.

Each sub-package (a room) exports what other rooms call from its ``__init__`` (its door): ``__all__`` lists the
names, ``_HOMES`` says which of the room's modules defines each, and the module-level ``__getattr__`` that this
module's :func:`load` serves imports that module when a name is first asked for. So importing a room costs
nothing, and a room whose modules need torch (the backend) can still hand out its torch-free names (what the live
backend can play) to a launcher that must not import torch. Type checkers read the same names from the door's
``if TYPE_CHECKING:`` imports.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping

__all__ = ["load"]


def load(package: str, homes: Mapping[str, tuple[str, ...]], name: str) -> object:
    """The value of ``package.name``, read from the module of ``package`` that ``homes`` names for it (importing it
    the first time); a module of the package that the door exports whole (``__all__`` names it, ``_HOMES`` does
    not) is imported. The value is not kept in the package: each look-up reads the home module, so a name replaced
    there (a test's monkeypatch) is what every later ``from package import name`` gets, as before the doors.
    Raises AttributeError (as a missing module attribute does) for a name the door does not export."""
    for module, names in homes.items():
        if name in names:
            value: object = getattr(importlib.import_module(f"{package}.{module}"), name)
            return value
    if name in getattr(sys.modules[package], "__all__", ()):  # a module the door exports whole: costmodels
        return importlib.import_module(f"{package}.{name}")
    raise AttributeError(f"module {package!r} has no attribute {name!r}")
