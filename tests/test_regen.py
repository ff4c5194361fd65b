"""The committed et_def_pb2.py/.pyi are exactly what the pinned generator makes of et_def.proto."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from nbox_trace.chakra import _regen

COMMITTED = Path(_regen.__file__).resolve().parent


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.skip("grpcio-tools (the pinned protoc) is not installed: pip install -e '.[dev]'")
    return _regen.generate(tmp_path_factory.mktemp("regen"))


def test_repo_root_holds_the_proto() -> None:
    assert (_regen.repo_root() / "nbox_trace" / "chakra" / "et_def.proto").is_file()
    assert _regen.repo_root() / "nbox_trace" / "chakra" == COMMITTED


def test_generates_both_files(generated: list[Path]) -> None:
    assert [p.name for p in generated] == ["et_def_pb2.py", "et_def_pb2.pyi"]
    assert all(p.is_file() and p.stat().st_size > 0 for p in generated)


@pytest.mark.parametrize("name", ["et_def_pb2.py", "et_def_pb2.pyi"])
def test_regenerated_file_is_byte_identical(generated: list[Path], name: str) -> None:
    (fresh,) = [p for p in generated if p.name == name]
    assert fresh.read_bytes() == (COMMITTED / name).read_bytes(), (
        f"nbox_trace/chakra/{name} is stale or hand-edited: run `python -m nbox_trace.chakra._regen`"
    )


def test_generator_is_the_pinned_protoc(generated: list[Path]) -> None:
    header = generated[0].read_text().splitlines()[:8]
    assert any(line.strip() == f"# Protobuf Python Version: 6.{_regen.PINNED_PROTOC}" for line in header), header
