"""Secrets planted at record time never survive `nbox bundle anonymize` (every byte is searched).

The script (tests/record_scripts/secret_model.py, copied under a secret directory name) plants: a custom
operator with a string argument, a record_function scope, a custom autograd Function, a process group
description, its own path, and an API key on its command line; an environment variable holds a token.
The original bundle must contain the planted names (so the test can fail), the anonymized ones none of
them, in any case, in any file, compressed or not; and they still verify and replay to the same time.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nbox_trace.bundle.anonymize import find_strings

ROOT = Path(__file__).resolve().parents[1]
SECRETS = ["sk-NIGHTINGALE-123", "tok-nightingale-777", "nightingale_secret_dir", "train_nightingale",
           "ProjectNightingale", "NightingaleFn", "tp_group_nightingale", "fused_gate", "nightingale-mode"]


def nbox(*args: object, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nbox", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def every_byte_lowercased(bundle: Path) -> bytes:
    out = []
    for p in sorted(bundle.rglob("*")):
        if p.is_file():
            raw = p.read_bytes()
            out.append(raw.lower())
            if raw[:2] == b"\x1f\x8b":
                out.append(gzip.decompress(raw).lower())
    return b"\n".join(out)


@pytest.mark.integration
def test_planted_secrets_are_gone_after_anonymize_and_the_bundle_still_replays(tmp_path: Path) -> None:
    secret_dir = tmp_path / "nightingale_secret_dir"
    secret_dir.mkdir()
    script = secret_dir / "train_nightingale.py"
    shutil.copy(ROOT / "tests" / "record_scripts" / "secret_model.py", script)
    bundle = tmp_path / "recorded"
    proc = nbox("record", "-n", 2, "--warmup", 2, "--iterations", 3, "-o", bundle, "--", script,
                "--api-key=sk-NIGHTINGALE-123", env={"NIGHTINGALE_TOKEN": "tok-nightingale-777"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    planted = {s for _, s in find_strings(bundle, SECRETS)}
    # What a recording carries (the token in the environment and the module class name are never recorded).
    assert planted >= set(SECRETS) - {"tok-nightingale-777"}, planted

    times = []
    for level in ("names", "strict"):
        out = tmp_path / f"anon-{level}"
        proc = nbox("bundle", "anonymize", bundle, "-o", out, "--level", level, "--json")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert find_strings(out, SECRETS) == []
        assert b"nightingale" not in every_byte_lowercased(out)
        verify = nbox("bundle", "verify", out)
        assert verify.returncode == 0, verify.stderr
        replay = nbox("replay", out, "--clock", "virtual", "--json")
        assert replay.returncode == 0, replay.stderr[-2000:]
        times.append(json.loads(replay.stdout)["what_if"]["iteration_us"])
    replay = nbox("replay", bundle, "--clock", "virtual", "--json")
    assert replay.returncode == 0, replay.stderr[-2000:]
    assert times == [json.loads(replay.stdout)["what_if"]["iteration_us"]] * 2
