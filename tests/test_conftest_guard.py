"""tests/conftest.py refuses a pytest that makes pytest-xdist drop the rank-launching tests' group
(pytest-dev/pytest-xdist#1386): they would run two at once on this 2-core machine, silently."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

_spec = importlib.util.spec_from_file_location("nbox_tests_conftest", Path(__file__).with_name("conftest.py"))
assert _spec is not None and _spec.loader is not None
guard = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(guard)


def _config(dist: str, workers: int) -> pytest.Config:
    options = {"dist": dist, "numprocesses": workers}
    return SimpleNamespace(getoption=lambda name, default=None: options.get(name, default))  # type: ignore[return-value]


def test_loadgroup_under_pytest_9_2_is_refused_naming_the_upstream_issue(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setattr(pytest, "__version__", "9.2.0")
    with pytest.raises(pytest.UsageError, match=r"pytest 9\.2\.0 with --dist loadgroup: .*pytest-xdist#1386"):
        guard.pytest_configure(_config("loadgroup", 2))
    guard.pytest_configure(_config("loadgroup", 0))  # -n 0: one process, nothing to group
    guard.pytest_configure(_config("load", 2))  # no groups asked for
    monkeypatch.setattr(pytest, "__version__", "9.1.1")
    guard.pytest_configure(_config("loadgroup", 2))
