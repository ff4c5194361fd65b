"""The ``nbox`` command line, one module per command group; :func:`main` is the console-script entry point."""

from nbox.cli import bundle, record, replay, scenario, trace  # noqa: F401 - each registers its commands on the app
from nbox.cli.app import app, main

__all__ = ["app", "main"]
