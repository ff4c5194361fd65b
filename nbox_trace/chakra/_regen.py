"""Regenerate ``et_def_pb2.py`` and ``et_def_pb2.pyi`` from ``et_def.proto``.

The generator is pinned: ``grpcio-tools==1.75.1`` bundles ``protoc`` 31.1, whose Python code
needs a protobuf runtime >= 6.31.1 (the same generator MLCommons Chakra 1.0.0 used). A test
regenerates into a temporary folder and asserts the committed files are identical.

Usage (from the repository root, dev extra installed)::

    python -m nbox_trace.chakra._regen            # rewrite the committed files
    python -m nbox_trace.chakra._regen OUT_DIR    # write into OUT_DIR/nbox_trace/chakra/ instead
"""

from __future__ import annotations

import sys
from pathlib import Path

PINNED_PROTOC = "31.1"
_PROTO_REL = "nbox_trace/chakra/et_def.proto"


def repo_root() -> Path:
    """The folder that holds ``nbox_trace`` (the ``-I`` root, so the proto is named ``nbox_trace/chakra/...``)."""
    return Path(__file__).resolve().parents[2]


def generate(out_dir: Path) -> list[Path]:
    """Run the pinned protoc on ``et_def.proto``; return the generated files under ``out_dir``."""
    from grpc_tools import protoc  # dev-only dependency, imported lazily

    root = repo_root()
    out_dir.mkdir(parents=True, exist_ok=True)
    args = ["protoc", f"-I{root}", f"--python_out={out_dir}", f"--pyi_out={out_dir}", str(root / _PROTO_REL)]
    code = protoc.main(args)
    if code != 0:
        raise RuntimeError(f"protoc failed on {_PROTO_REL} with exit code {code}")
    gen = out_dir / "nbox_trace" / "chakra"
    return [gen / "et_def_pb2.py", gen / "et_def_pb2.pyi"]


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else repo_root()
    for path in generate(target):
        print(path)
