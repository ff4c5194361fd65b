"""``nbox bundle inspect|verify|pack|unpack|merge|diff|anonymize``: thin commands over the bundle library.

Each parses its arguments, calls one library function (:mod:`nbox_trace.bundle.inspection`,
:mod:`nbox_trace.bundle.verify`, :mod:`nbox_trace.bundle.archive`, :mod:`nbox_trace.bundle.merge`,
:mod:`nbox_trace.bundle.diff`,
:mod:`nbox_trace.bundle.anonymize`) and
prints the result on stdout: human text, or exactly one JSON document with ``--json``.
Commands that read a bundle accept a directory or a ``.nbox`` archive (unpacked, checked, into a
temporary directory that is removed afterwards).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from nbox.cli.app import EXIT_PROBLEMS, PanelCommand, app

bundle_app = typer.Typer(help="Share trace bundles: inspect, verify, pack, unpack, merge, diff, anonymize.",
                         no_args_is_help=True)
app.add_typer(bundle_app, name="bundle")

_JSON = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]


def _emit(doc: dict[str, Any], lines: list[str], json_out: bool) -> None:
    """The command's result on stdout: one JSON document, or the human lines."""
    sys.stdout.write(json.dumps(doc, indent=1, default=str) + "\n" if json_out else "\n".join(lines) + "\n")


def _as_directory(path: Path) -> contextlib.AbstractContextManager[Path]:
    from nbox_trace.bundle import bundle_directory

    return bundle_directory(path)


@bundle_app.command("inspect", cls=PanelCommand)
def inspect_cmd(bundle: Annotated[Path, typer.Argument(help="Bundle directory or .nbox archive.")],
                json_out: _JSON = False) -> None:
    """Manifest facts, per-rank trace summaries, and size on disk. Exit 1 when a listed file is missing.

    Examples:

      nbox bundle inspect traces/ddp_mlp

      nbox bundle inspect received.nbox --json
    """
    import dataclasses

    from nbox_trace.bundle import inspect_bundle

    with _as_directory(bundle) as root:
        summary = dataclasses.replace(inspect_bundle(root), path=str(bundle))
        _emit(summary.to_dict(), summary.lines(), json_out)
    if summary.missing_files:
        raise typer.Exit(EXIT_PROBLEMS)


@bundle_app.command("verify", cls=PanelCommand)
def verify_cmd(bundle: Annotated[Path, typer.Argument(help="Bundle directory or .nbox archive.")],
               json_out: _JSON = False) -> None:
    """Check a bundle: files and hashes against the manifest, version, traces (--strict rules), and the
    collective sequences across ranks. Exit 0 only when every check holds, else 1.

    Examples:

      nbox bundle verify received.nbox

      nbox bundle verify traces/ddp_mlp --json
    """
    from nbox_trace.bundle import verify_bundle

    report = verify_bundle(bundle)
    _emit(report.to_dict(), report.lines(), json_out)
    if not report.ok:
        raise typer.Exit(EXIT_PROBLEMS)


@bundle_app.command("pack", cls=PanelCommand)
def pack_cmd(bundle: Annotated[Path, typer.Argument(help="Bundle directory (it must verify).")],
             out: Annotated[Path, typer.Option("-o", "--out", help="Archive to write (.nbox).")],
             overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing archive.")] = False,
             json_out: _JSON = False) -> None:
    """Pack a bundle directory into one portable, reproducible archive (gzip'd ustar, manifest first).

    Example:

      nbox bundle pack traces/ddp_mlp -o ddp_mlp.nbox
    """
    from nbox_trace.bundle import pack_bundle
    from nbox_trace.files import Output, check_outputs
    from nbox_trace.units import format_bytes

    check_outputs([Output("-o/--out", out, "file", overwrite)], inputs=[bundle])
    path = pack_bundle(bundle, out, overwrite=overwrite)
    size = path.stat().st_size
    _emit({"archive": str(path), "bytes": size}, [f"packed {bundle} into {path} ({format_bytes(size)})"], json_out)


@bundle_app.command("unpack", cls=PanelCommand)
def unpack_cmd(archive: Annotated[Path, typer.Argument(help="The .nbox archive.")],
               out: Annotated[Path, typer.Argument(help="Directory to create.")],
               overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing directory.")]
               = False,
               json_out: _JSON = False) -> None:
    """Unpack an archive member by member against its manifest (nothing outside OUT, no links, size caps);
    on any problem nothing is left at OUT.

    Example:

      nbox bundle unpack received.nbox received/
    """
    from nbox_trace.bundle import unpack_bundle
    from nbox_trace.files import Output, check_outputs

    check_outputs([Output("OUT", out, "dir", overwrite)], inputs=[archive])
    path = unpack_bundle(archive, out, overwrite=overwrite)
    _emit({"bundle": str(path)}, [f"unpacked {archive} into {path} (every file checked against the manifest)"],
          json_out)


@bundle_app.command("merge", cls=PanelCommand)
def merge_cmd(bundles: Annotated[list[Path], typer.Argument(help="Each node's bundle (directory or .nbox).")],
              out: Annotated[Path, typer.Option("-o", "--out", help="Bundle directory to write.")],
              overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing bundle.")] = False,
              json_out: _JSON = False) -> None:
    """Join the per-node bundles of one multi-node recording into one bundle of every rank.

    Each node's `nbox record --nnodes N --node-rank R --rdzv-endpoint HOST:PORT` writes its own ranks; the
    bundles must be of one run (same job id, world size, versions, capture settings) and hold every rank once.

    Example:

      nbox bundle merge node0.bundle node1.bundle -o run.bundle && nbox bundle verify run.bundle
    """
    from nbox_trace.bundle import merge_bundles
    from nbox_trace.files import Output, check_outputs
    from nbox_trace.units import format_us

    check_outputs([Output("-o/--out", out, "dir", overwrite)], inputs=list(bundles))
    result = merge_bundles(bundles, out, overwrite=overwrite)
    lines = [f"merged {len(bundles)} bundles into {result.out}: ranks {result.ranks}, observed iteration median "
             f"{format_us(result.observed_median_us)} (over the ranks of every node)"]
    lines += [f"  node {n['node_rank']}: ranks {n['ranks']} ({n['hostname']}, {n['local_addr']})" for n in result.nodes]
    _emit(result.to_dict(), lines, json_out)


@bundle_app.command("diff", cls=PanelCommand)
def diff_cmd(a: Annotated[Path, typer.Argument(help="Bundle A (directory or .nbox).")],
             b: Annotated[Path, typer.Argument(help="Bundle B (directory or .nbox).")],
             top: Annotated[int, typer.Option(help="Rows per table in the human output.", min=1)] = 10,
             json_out: _JSON = False) -> None:
    """What changed from A to B, to answer "why is this run slower than that one?": environment,
    operators added/removed, compute time per operator and family, collectives added/removed/resized,
    observed iteration time.

    Example:

      nbox bundle diff last_week.nbox today/
    """
    from nbox_trace.bundle import diff_bundles

    with _as_directory(a) as root_a, _as_directory(b) as root_b:
        d = diff_bundles(root_a, root_b)
        _emit(d.to_dict(), d.lines(top=top), json_out)


@bundle_app.command("anonymize", cls=PanelCommand)
def anonymize_cmd(
    bundle: Annotated[Path, typer.Argument(help="Bundle directory or .nbox archive.")],
    out: Annotated[Path, typer.Option("-o", "--out", help="Anonymized bundle directory to write.")],
    level: Annotated[str, typer.Option(help="names: hash custom names, paths, hosts, command lines; "
                                       "strict: also drop shapes (replay then uses recorded compute).")] = "names",
    key_file: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        help="Hashing key (>= 16 bytes); the same key gives the same tokens, so anonymized bundles still diff. "
             "Default: a random key, used once.")] = None,
    save_key: Annotated[Optional[Path], typer.Option(  # noqa: UP045
        help="Write the (random) key used here to this new file (mode 0600), to reuse it with --key-file.")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing output.")] = False,
    json_out: _JSON = False,
) -> None:
    """Remove what a company would not share (custom operator and module names, scopes, file paths, hosts,
    users, environment, command lines) by consistent keyed hashing; keep what replay needs.

    Examples:

      nbox bundle anonymize run/ -o run.anon --save-key team.key

      nbox bundle anonymize run2/ -o run2.anon --key-file team.key --level strict
    """
    from nbox_trace.bundle import LEVELS, AnonymizeConfig, anonymize_bundle
    from nbox_trace.errors import InvalidInputError, OutputWriteError, UsageError
    from nbox_trace.files import Output, check_outputs

    if level not in LEVELS:
        raise UsageError(f"--level {level!r}: must be one of {', '.join(LEVELS)}")
    if key_file is not None and save_key is not None:
        raise UsageError("--key-file and --save-key: give one (the key is already in the key file)")
    check_outputs([Output("-o/--out", out, "dir", overwrite), Output("--save-key", save_key, "file")],
                  inputs=[bundle, key_file])
    key = None
    if key_file is not None:
        try:
            key = key_file.read_bytes()[:4096]
        except OSError as exc:
            raise InvalidInputError(f"{key_file}: cannot read the key: {exc.strerror or exc}") from None
    elif save_key is not None:
        key = os.urandom(32)
    config = AnonymizeConfig(level=level, key=key)
    if save_key is not None and key is not None:  # claim the key file first: a clash must stop us before any output
        try:
            fd = os.open(save_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(key)
        except OSError as exc:
            raise OutputWriteError(f"{save_key}: cannot write the key: {exc.strerror or exc}") from None
    try:
        with _as_directory(bundle) as root:
            result = anonymize_bundle(root, out, config, overwrite=overwrite)
    except BaseException:
        if save_key is not None:
            save_key.unlink(missing_ok=True)  # the bundle was not written: its key must not be left behind
        raise
    doc = {"bundle": str(result.out), "level": result.level, "key_id": result.key_id, "replaced": result.replaced,
           "kept_operators": result.kept_operators, "dropped_shapes": result.dropped_shapes,
           "dropped_files": list(result.dropped_files)}
    lines = [f"anonymized {bundle} into {result.out} (level {result.level}, key id {result.key_id})",
             "  replaced (distinct names): " + (", ".join(f"{k} {v}" for k, v in result.replaced.items()) or "none"),
             f"  standard operators kept: {result.kept_operators}"]
    if result.dropped_shapes:
        lines.append("  shapes dropped: replay it with --compute recorded")
    if result.dropped_files:
        lines.append(f"  files left out: {', '.join(result.dropped_files)}")
    _emit(doc, lines, json_out)

