"""nbox's injected ``sitecustomize``: chains to the one it shadows, then installs the recorder.

Python imports the first ``sitecustomize`` on ``sys.path`` at start-up. ``nbox record`` puts this file's
folder first on ``PYTHONPATH``, which would hide a ``sitecustomize`` the environment already has (Debian
and Ubuntu ship one, virtual environments and clusters often add one): that one runs first, as if nbox were
not there. Then, only when ``NBOX_RECORD_DIR`` is set, :func:`nbox_record.capture.bootstrap.install` runs; it
decides whether this process records (ranks do, those nbox starts and those torchrun starts; torchrun's agent and
children of a rank do not). Without ``NBOX_RECORD_DIR`` this file only chains.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import traceback


def _chain() -> None:
    """Execute the ``sitecustomize`` that this one shadows, if any, as ``_nbox_chained_sitecustomize``."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    if spec.origin and os.path.abspath(spec.origin) == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_nbox_chained_sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception:
        # What site.py does for a failing sitecustomize: report and carry on.
        print(f"Error in sitecustomize {spec.origin} (chained by nbox):", file=sys.stderr)
        traceback.print_exc()


def _install() -> None:
    if not os.environ.get("NBOX_RECORD_DIR"):
        return
    try:
        from nbox_record.capture import bootstrap
    except ImportError as exc:
        if "RANK" in os.environ:  # a rank that was asked to record and cannot: fail loudly
            print(f"nbox: NBOX_RECORD_DIR is set but nbox_record cannot be imported: {exc}", file=sys.stderr)
            sys.stderr.flush()
            os._exit(1)
        return
    bootstrap.install()


_chain()
_install()
