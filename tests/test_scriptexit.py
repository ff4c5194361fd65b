"""How a script ended, read from its main module's frame (nbox_record.handoff.scriptexit): run in a child Python so the
frame really is ``__main__``'s."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent("""
    import atexit, sys
    from nbox_record.handoff.scriptexit import ended_by_exception, main_frame
    frame = main_frame()
    atexit.register(lambda: print("ENDED_BY_EXCEPTION" if ended_by_exception(frame) else "RETURNED", flush=True))
    def main(how):
        if how == "raise":
            raise SystemExit("boom")
        if how == "exit":
            sys.exit(3)
        if how == "zero":
            sys.exit(0)
    try:
        main(sys.argv[1])
    finally:
        pass
""")


@pytest.mark.parametrize(("how", "said", "code"), [("raise", "ENDED_BY_EXCEPTION", 1),
                                                   ("exit", "ENDED_BY_EXCEPTION", 3),
                                                   ("zero", "ENDED_BY_EXCEPTION", 0),
                                                   ("end", "RETURNED", 0)])
def test_the_frame_tells_a_system_exit_from_an_end(how: str, said: str, code: int) -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE, how], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == code and proc.stdout.strip() == said, (proc.stdout, proc.stderr)


def test_no_frame_is_not_an_exception() -> None:
    from nbox_record.handoff.scriptexit import ended_by_exception

    assert ended_by_exception(None) is False
