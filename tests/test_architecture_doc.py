"""docs/architecture.md names real functions: every ``module.path:function`` its walk of one collective names is
imported and looked up (issue 52), and the picture names every room of every layer."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
#: A named function in the doc: `package.module:function` or `package.module:Class.method`, in backticks.
NAMED = re.compile(r"`((?:nbox|nbox_record|nbox_replay|emulator_core|nbox_trace)(?:\.\w+)*):(\w+(?:\.\w+)*)`")


def _missing(text: str) -> list[str]:
    """The ``module:qualname`` references in ``text`` whose module does not import or lacks the name."""
    missing = []
    for module_name, qualname in NAMED.findall(text):
        try:
            obj: object = importlib.import_module(module_name)
            for part in qualname.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{module_name}:{qualname} ({type(exc).__name__}: {exc})")
    return missing


def test_every_function_the_walk_names_exists() -> None:
    text = DOC.read_text(encoding="utf-8")
    named = NAMED.findall(text)
    assert len(named) >= 20, named  # the walk names a function at each of its steps
    assert not _missing(text), "\n".join(_missing(text))


def test_the_name_check_can_fail() -> None:
    assert _missing("`nbox_replay.replay:run_replay` and `emulator_core.pricing.answer:Fabric.answer`") == []
    bad = _missing("`nbox_replay.replay:no_such_step`, `nbox_replay.no_such_module:f` and "
                   "`emulator_core.pricing.answer:Fabric.no_such_method`")
    assert [b.split(" ")[0] for b in bad] == ["nbox_replay.replay:no_such_step", "nbox_replay.no_such_module:f",
                                             "emulator_core.pricing.answer:Fabric.no_such_method"]


def test_the_picture_names_every_room() -> None:
    """Each sub-package appears in the picture as ``name/`` (the static tests hold the same list, in order)."""
    from tests.test_static import ROOMS

    picture = DOC.read_text(encoding="utf-8").split("```")[1]
    absent = [f"{package}/{room}" for package, rooms in ROOMS.items() for room in rooms
              if not re.search(rf"(?m)(?:^|│)\s+{re.escape(room)}/", picture)]
    assert not absent, absent
