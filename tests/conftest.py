"""Shared fixtures for the nbox test-suite.

Sample traces written by other tools live in ``tests/data/samples`` (see ``MANIFEST.md`` there for each file's
source); they are part of the repository, so a test that needs them fails, never skips, when they are missing.

Test functions that take one of these arguments are parametrized over sample files (ids are the
paths relative to the samples folder):

* ``sample_et``: every Chakra ET file under ``chakra_et/`` and ``cpu_gloo_official_pipeline/*.et``;
* ``microbench_et``: the 112 ASTRA-sim microbenchmark files.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

#: The repository root (the folder holding ``nbox/`` and ``tests/``).
REPO_ROOT = Path(__file__).resolve().parents[1]
#: Real traces from other tools, kept beside the repository (never edited by tests).
SAMPLES = REPO_ROOT / "tests" / "data" / "samples"


def _require_samples() -> None:
    if not (SAMPLES / "chakra_et").is_dir():
        raise FileNotFoundError(f"sample traces not found: {SAMPLES} (they are part of the repository)")


def _rank_key(path: Path) -> tuple[str, int, str]:
    """Sort ``<prefix>.<rank>.et`` numerically by rank inside a folder."""
    parts = path.name.split(".")
    rank = int(parts[-2]) if len(parts) >= 3 and parts[-2].isdigit() else -1
    return (str(path.parent), rank, path.name)


def sample_et_files() -> list[Path]:
    """All sample ET files (raw protobuf), sorted by folder then rank."""
    _require_samples()
    files = list((SAMPLES / "chakra_et").rglob("*.et")) + list((SAMPLES / "cpu_gloo_official_pipeline").glob("*.et"))
    return sorted(files, key=_rank_key)


def microbench_files() -> list[Path]:
    return [p for p in sample_et_files() if "astra-sim_microbenchmarks" in p.parts]


def _params(files: list[Path]) -> list[object]:
    assert files, f"no sample files under {SAMPLES}"
    return [pytest.param(p, id=p.relative_to(SAMPLES).as_posix()) for p in files]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sample_et" in metafunc.fixturenames:
        metafunc.parametrize("sample_et", _params(sample_et_files()))
    if "microbench_et" in metafunc.fixturenames:
        metafunc.parametrize("microbench_et", _params(microbench_files()))


@pytest.fixture(scope="session")
def samples() -> Path:
    """The samples folder (part of the repository)."""
    _require_samples()
    return SAMPLES


#: Test files that start real ranks (torchrun): all their tests run on one pytest-xdist worker, one at
#: a time, so two rank launches never compete for this 2-core machine; the fast unit tests of every
#: other file run on the other worker meanwhile (``-n 2 --dist loadgroup`` in pyproject.toml).
RANK_FILES = {"test_anonymize_record.py", "test_backend.py", "test_calibrate.py", "test_emulate.py",
              "test_emulate_models.py", "test_readme.py", "test_record_bn_nosync.py",
              "test_record_bootstrap.py", "test_record_cli.py", "test_zoo_emulate.py", "test_zoo_record.py",
              "test_record_gpu.py", "test_replay_live.py", "test_real_models.py"}


#: Rank-launching test files whose launches each start one process (a live replay of one rank): they run first in
#: the ``ranks`` group, while the other worker's unit tests hold the other core, so the two-rank launches come
#: later, when both cores are free (2026-11-27: the group was 1053 s of a 1072 s suite, CI's limit 20 minutes).
ONE_PROCESS_FILES = ("test_live_truth.py",)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the group into the node id
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name not in ONE_PROCESS_FILES)  # stable: collection order otherwise
    testbed_skip = None
    for item in items:
        testbed = item.get_closest_marker("testbed") is not None
        if item.path.name in RANK_FILES or testbed or item.get_closest_marker("integration") is not None:
            item.add_marker(pytest.mark.xdist_group("ranks"))
        if testbed:  # network namespaces need root: skip saying why where it is missing (CI runs as root)
            if testbed_skip is None:
                from nbox_trace.testbed.namespaces import unavailable

                testbed_skip = unavailable() or ""
            if testbed_skip:
                item.add_marker(pytest.mark.skip(reason=f"testbed: {testbed_skip}"))


def pytest_configure(config: pytest.Config) -> None:
    """Refuse ``--dist loadgroup`` under pytest >= 9.2, which makes pytest-xdist drop every group silently
    (pytest-dev/pytest-xdist#1386): the rank-launching tests would run two at once on this 2-core machine."""
    if (os.environ.get("PYTEST_XDIST_WORKER") or config.getoption("dist", "no") != "loadgroup"
            or not config.getoption("numprocesses", None)):  # -n 0: one process, nothing to group
        return
    version = tuple(int(p) for p in pytest.__version__.split(".")[:2] if p.isdigit())
    if version >= (9, 2):
        raise pytest.UsageError(f"pytest {pytest.__version__} with --dist loadgroup: pytest-xdist drops every "
                                f"xdist_group (pytest-dev/pytest-xdist#1386), so rank-launching tests would run two "
                                f"at once; install the pinned range (pip install -e '.[dev]': pytest < 9.2)")


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Refuse to run when pytest-xdist did not apply the ``ranks`` group after all (it writes the group into each
    grouped test's node id, which pytest 9.2 ignores): a backstop to :func:`pytest_configure`'s version check."""
    if not (os.environ.get("PYTEST_XDIST_WORKER") and session.config.getvalue("loadgroup")):
        return
    lost = [item.nodeid for item in session.items
            if item.get_closest_marker("xdist_group") is not None and not item.nodeid.endswith("@ranks")]
    if lost:
        raise pytest.UsageError(f"pytest-xdist did not group {len(lost)} rank-launching test(s), e.g. {lost[0]}: "
                                f"rank launches would run two at once (pytest-dev/pytest-xdist#1386; pyproject.toml "
                                f"pins pytest < 9.2)")
