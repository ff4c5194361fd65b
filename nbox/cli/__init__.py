"""The ``nbox`` command line, one module per command group; :func:`main` is the console-script entry point.

The face: argv -> one frozen config -> one library call, through the doors of the rooms below. May import: every
layer below (record, replay, the emulator core, the base), typer and rich; the engines inside each command, so that
``nbox --help`` loads no torch.
"""

from nbox.cli import bundle, record, replay, scenario, trace  # noqa: F401 - each registers its commands on the app
from nbox.cli.app import app, main

__all__ = ["app", "main"]
