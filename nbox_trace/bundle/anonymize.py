"""``nbox bundle anonymize``: hash every user-chosen name in a bundle, keep what replay needs.

Default deny: a string is kept only when the allowlist below keeps it; everything else becomes
``anon_<first 12 hex of HMAC-SHA256(key, category + "\\0" + name)>``. The same name gives the same token everywhere
in the bundle (node names, ``op_schema``, ``nbox_children``, ``comm_group.json``, ``pg_name``, the manifest's process
groups), so cross-rank matching and replay still work, and two bundles anonymized with one key can still be diffed.

Kept (replay needs them):

* operators in :data:`OP_NAMESPACES` (``aten``, ``prim``, ``c10d``, the functional collectives, ``fsdp``,
  ``_dtensor``, ``inductor``, DDP's ``torch.distributed.ddp.reducer``, and ``profiler``, whose string arguments,
  the user's ``record_function`` names, are hashed as annotations), with their ``op_schema``; :data:`KEPT_NAMES`;
  ``autograd::engine::evaluate_function: <X>`` when X is codegen'd (``[A-Za-z0-9_]+Backward[0-9]+``),
  ``torch::autograd::<Name>`` or in :data:`KEPT_NAMES` (a custom ``autograd.Function``'s ``<Class>Backward`` is hashed);
* nbox markers ``## nbox:... ##`` and ``## process_group:init ##``; the annotation scopes :func:`anonymize_scope`
  knows (``FSDP::<phase>`` with its module path hashed, ``DistributedDataParallel.forward``, ``ProfilerStep#N``,
  ``Optimizer.step#<torch.optim class>.step``); GPU kernels with a vendor or PyTorch prefix (:data:`KERNEL_PREFIXES`);
* shapes, dtypes/types, strides, durations, dependencies, ids, numbers, comm attributes, iteration markers, numeric
  process-group names, device strings and ``<None>``-style placeholders.

Hashed: other operator names with their whole ``op_schema`` (live replay then uses the recorded duration), other
annotation scopes, string arguments of other operators (and path-like ones, holding ``/`` or ``\\``, of kept ones such
as ``aten::from_file``), non-numeric process-group names and descriptions, unknown string attributes; in the
manifest ``job.script``, ``job.args``, ``hardware.hostname``, ``producer.converted_from`` and every string not on
:data:`MANIFEST_KEEP`. ``strict`` also drops every tensor value, shape and stride (those inside ``nbox_children``
too), keeps types, durations and comm sizes, and writes ``replay_compute: "recorded"`` in the manifest.
"""

from __future__ import annotations

import gzip
import hashlib
import hmac
import io
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nbox_trace import __version__
from nbox_trace.bundle.manifest import (
    COMM_GROUP_NAME,
    TRACE_PREFIX,
    Manifest,
    read_manifest,
    verify_files,
    write_bundle,
)
from nbox_trace.chakra import EtReader, EtWriter
from nbox_trace.chakra import et_def_pb2 as pb
from nbox_trace.contract import parse_pg_init
from nbox_trace.errors import InvalidInputError

__all__ = ["LEVELS", "AnonymizeConfig", "AnonymizeError", "AnonymizeResult", "anonymize_bundle",
           "anonymize_scope", "find_strings"]

LEVELS = ("names", "strict")
MIN_KEY_BYTES = 16
OP_NAMESPACES = frozenset({"aten", "prim", "c10d", "_c10d_functional", "c10d_functional",
                           "_c10d_functional_autograd", "_dtensor", "fsdp", "profiler", "inductor",
                           "torch.distributed.ddp.reducer"})
#: torch-internal operator / autograd.Function names without a namespace.
KEPT_NAMES = frozenset({"## process_group:init ##", "record_param_comms", "RegisterPostBackwardFunction",
                        "RegisterPostBackwardFunctionBackward", "CompiledFunction", "CompiledFunctionBackward"})
TORCH_OPTIMIZERS = frozenset({"SGD", "Adam", "AdamW", "Adamax", "Adadelta", "Adagrad", "Adafactor", "ASGD", "LBFGS",
                              "NAdam", "RAdam", "RMSprop", "Rprop", "SparseAdam", "Muon"})
KERNEL_PREFIXES = ("Memcpy ", "Memset ", "void at::", "at::", "void cutlass", "cutlass", "ncclDevKernel",
                   "ncclKernel", "void ncclKernel", "sm80_", "sm86_", "sm89_", "sm90_", "sm100_", "ampere_",
                   "volta_", "turing_", "void cudnn", "cudnn", "void cublas", "cublas", "void gemv", "gemv",
                   "void splitKreduce", "void pytorch_flash::", "nvjet")
#: manifest strings kept as they are: section -> keys.
MANIFEST_KEEP: dict[str, frozenset[str]] = {
    "producer": frozenset({"nbox", "torch", "backend", "cuda", "nccl", "python", "source_schema"}),
    "hardware": frozenset({"machine", "processor", "device", "gpu", "gpu_name", "gpu_names", "cuda_capability"}),
    "job": frozenset({"nnodes"}),
    "observed": frozenset({"rule"}),
    "capture": frozenset({"boundary", "source"}),
    "extra": frozenset({"replay_compute"}),  # kept: a strict bundle re-anonymized stays recorded-only
}
#: string attributes whose values are fixed vocabularies written by nbox/torch.
KEPT_STRING_ATTRS = frozenset({"nbox_comm_source", "nbox_dtype", "nbox_gpu_kind", "nbox_kineto_join", "schema",
                               "nbox_producer", "nbox_in_split_sizes", "nbox_out_split_sizes"})
STRIDE_ATTRS = frozenset({"nbox_input_strides", "nbox_output_strides"})
KEPT_PG_DESCS = frozenset({"default_pg", "undefined"})
KNOWN_BACKENDS = frozenset({"gloo", "nccl", "mpi", "ucc", "xccl", "fake", "cpu", "cuda", "undefined"})

_BACKWARD = re.compile(r"^[A-Za-z0-9_]+Backward[0-9]+\Z")
_TORCH_AUTOGRAD = re.compile(r"^torch::autograd::[A-Za-z]+\Z")
_EVAL_FN = "autograd::engine::evaluate_function: "
_NBOX_MARKER = re.compile(r"^## nbox:[A-Za-z0-9_:.\- ]{0,100} ##\Z")
_PROFILER_STEP = re.compile(r"^ProfilerStep#[0-9]+\Z")
_OPTIMIZER = re.compile(r"^Optimizer\.(step|zero_grad)#([A-Za-z0-9_]+)\.(step|zero_grad)\Z")
_FSDP = re.compile(r"^(FSDP::[A-Za-z_]+)(?: \((.*)\))?\Z")
_PLACEHOLDER = re.compile(r"^<[A-Za-z]+>\Z")
_DEVICE = re.compile(r"^(cpu|cuda|meta|mps|xpu|hpu|mtia|privateuseone)(:[0-9]+)?\Z")
_SAFE_TYPE = re.compile(r"^[A-Za-z0-9_\[\](), ]*\Z")
_NUMERIC = re.compile(r"^[0-9]+\Z")
_MAX_GUNZIP = 1 << 30


class AnonymizeError(InvalidInputError):
    """A bundle cannot be anonymized (does not verify, bad key or level, output onto the input)."""


@dataclass(frozen=True)
class AnonymizeConfig:
    """What to anonymize. ``key`` None: 32 random bytes (tokens then differ from any other run)."""

    level: str = "names"
    key: bytes | None = None

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise AnonymizeError(f"anonymize level {self.level!r}: must be one of {', '.join(LEVELS)}")
        if self.key is not None and (not isinstance(self.key, bytes) or len(self.key) < MIN_KEY_BYTES):
            raise AnonymizeError(f"anonymize key: must be at least {MIN_KEY_BYTES} bytes")


@dataclass(frozen=True)
class AnonymizeResult:
    """What :func:`anonymize_bundle` did. ``key_id`` identifies the key (sha256 prefix), never reveals it."""

    out: Path
    level: str
    key_id: str
    replaced: dict[str, int]
    kept_operators: int
    dropped_shapes: bool
    dropped_files: tuple[str, ...] = field(default=())


class _Hasher:
    """Keyed, memoized name -> token; remembers what it replaced and which operators it kept."""

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.seen: dict[str, set[str]] = {}
        self.kept_ops: set[str] = set()
        self._memo: dict[tuple[str, str], str] = {}

    def token(self, category: str, name: str) -> str:
        found = self._memo.get((category, name))
        if found is None:
            msg = (category + "\0" + name).encode("utf-8", "surrogatepass")
            found = "anon_" + hmac.new(self.key, msg, hashlib.sha256).hexdigest()[:12]
            self._memo[(category, name)] = found
            self.seen.setdefault(category, set()).add(name)
        return found

    # -- operators -------------------------------------------------------------------------
    def op_allowed(self, name: str) -> bool:
        if name in KEPT_NAMES or _NBOX_MARKER.match(name):
            return True
        if name.startswith(_EVAL_FN):
            x = name[len(_EVAL_FN):]
            return bool(_BACKWARD.match(x) or _TORCH_AUTOGRAD.match(x)) or x in KEPT_NAMES
        ns, sep, _ = name.partition("::")
        return bool(sep) and ns in OP_NAMESPACES

    def op(self, name: str) -> str:
        if not name:
            return name
        if self.op_allowed(name):
            self.kept_ops.add(name)
            return name
        if name.startswith(_EVAL_FN):
            return _EVAL_FN + self.token("operator", name[len(_EVAL_FN):])
        return self.token("operator", name)

    def schema(self, schema: str) -> str:
        if not schema:
            return schema
        head = schema.split("(", 1)[0].strip()
        ns, sep, rest = head.partition("::")
        base = f"{ns}::{rest.split('.', 1)[0]}" if sep else head
        if sep and ns in OP_NAMESPACES:
            return schema
        return self.token("operator", base)

    def kernel(self, name: str) -> str:
        return name if name.startswith(KERNEL_PREFIXES) else self.token("kernel", name)

    def pg(self, name: str) -> str:
        return name if name == "" or _NUMERIC.match(name) else self.token("process_group", name)

    def pg_desc(self, desc: str) -> str:
        return desc if desc in KEPT_PG_DESCS else self.token("pg_desc", desc)

    def kept_value(self, s: str) -> str:
        """A string argument of an allowlisted operator: kept unless it looks like a path."""
        return self.token("path", s) if "/" in s or "\\" in s else s

    def record_name(self, s: str) -> str:
        """A string argument of a ``profiler::`` operator: a record_function name, hashed as its scope."""
        return s if s == "" or _PLACEHOLDER.match(s) or _DEVICE.match(s) else self.scope(s)

    def string_value(self, s: str) -> str:
        if s == "" or _PLACEHOLDER.match(s) or _DEVICE.match(s):
            return s
        return self.token("string_value", s)

    def type_name(self, s: str) -> str:
        return s if _SAFE_TYPE.match(s) or s.startswith("__torch__.torch.classes.c10d.") else self.token("type", s)

    def scope(self, scope: str) -> str:
        return anonymize_scope(scope, self)


def anonymize_scope(scope: str, hasher: _Hasher) -> str:
    """One ``record_function`` scope: kept when torch-internal (module docstring), else hashed."""
    if scope in ("", "DistributedDataParallel.forward") or _PROFILER_STEP.match(scope) or _NBOX_MARKER.match(scope):
        return scope
    m = _OPTIMIZER.match(scope)
    if m and m.group(2) in TORCH_OPTIMIZERS:
        return scope
    m = _FSDP.match(scope)
    if m:
        return m.group(1) if m.group(2) is None else f"{m.group(1)} ({hasher.token('module', m.group(2))})"
    return hasher.token("annotation", scope)


def _walk_strings(value: Any, fn: Callable[[str], str]) -> Any:
    """A copy of a JSON value with every string (not dict keys) passed through ``fn``; iterative-safe depth."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, list):
        return [_walk_strings(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: _walk_strings(v, fn) for k, v in value.items()}
    return value


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


class _Anonymizer:
    def __init__(self, hasher: _Hasher, strict: bool) -> None:
        self.h = hasher
        self.strict = strict

    def io_values(self, text: str, fn: Callable[[str], str]) -> str:
        if not text or (fn == self.h.kept_value and "/" not in text and "\\" not in text):
            return text
        data = _json_or_none(text)
        if data is None:
            return self.h.token("string_value", text)
        new = _walk_strings(data, fn)
        return text if new == data else _dumps(new)

    def io_types(self, text: str) -> str:
        if not text:
            return text
        data = _json_or_none(text)
        return self.h.token("type", text) if data is None else _dumps(_walk_strings(data, self.h.type_name))

    def value_fn(self, name: str) -> Callable[[str], str]:
        """How string arguments of operator ``name`` are treated."""
        if name.startswith("profiler::"):
            return self.h.record_name
        return self.h.kept_value if self.h.op_allowed(name) else self.h.string_value

    def io(self, io: pb.IOInfo, fn: Callable[[str], str]) -> None:
        if self.strict:
            io.values, io.shapes = "", ""
        else:
            io.values = self.io_values(io.values, fn)
        io.types = self.io_types(io.types)

    def pg_init(self, node: pb.Node) -> None:
        if not node.inputs.values:
            return
        try:
            groups = parse_pg_init(node.inputs.values)
        except ValueError:
            groups = []
        out = []
        for g in groups:
            new: dict[str, Any] = {}
            for k, v in g.items():
                if k == "pg_name" and isinstance(v, str):
                    new[k] = self.h.pg(v)
                elif k == "pg_desc" and isinstance(v, str):
                    new[k] = self.h.pg_desc(v)
                elif k == "backend_config" and isinstance(v, str):
                    parts = re.split(r"[:,]", v)
                    new[k] = v if all(p in KNOWN_BACKENDS for p in parts) else self.h.token("string_value", v)
                else:
                    new[k] = _walk_strings(v, self.h.string_value)
            out.append(new)
        node.inputs.values = _dumps(out)
        node.inputs.types = self.io_types(node.inputs.types)
        if node.HasField("outputs"):
            node.outputs.values = self.io_values(node.outputs.values, self.h.string_value)

    def children(self, text: str) -> str | None:
        data = _json_or_none(text)
        if not isinstance(data, list):
            return None
        out = []
        for entry in data:
            if not isinstance(entry, dict):
                return None
            name = entry.get("name")
            fn = self.value_fn(name) if isinstance(name, str) else self.h.string_value
            new: dict[str, Any] = {}
            for k, v in entry.items():
                if k == "name" and isinstance(v, str):
                    new[k] = self.h.op(v)
                elif k == "op_schema" and isinstance(v, str):
                    new[k] = self.h.schema(v)
                elif k in ("inputs", "outputs") and isinstance(v, dict):
                    side: dict[str, Any] = {}
                    for sk, sv in v.items():
                        if sk == "types":
                            side[sk] = _walk_strings(sv, self.h.type_name)
                        elif sk in ("values", "shapes") and self.strict:
                            side[sk] = []
                        elif sk == "values":
                            side[sk] = _walk_strings(sv, fn)
                        elif sk == "shapes":
                            side[sk] = sv
                        else:
                            side[sk] = _walk_strings(sv, self.h.string_value)
                    new[k] = side
                elif k == "input_strides" and self.strict:
                    continue
                else:
                    new[k] = _walk_strings(v, self.h.string_value)
            out.append(new)
        return _dumps(out)

    def attrs(self, attrs: Any, node_name: str | None) -> None:
        drop: list[pb.AttributeProto] = []
        for a in list(attrs):
            kind = a.WhichOneof("value")
            name = a.name
            if name in STRIDE_ATTRS and self.strict:
                drop.append(a)
                continue
            if kind == "string_val":
                v = a.string_val
                if name == "op_schema":
                    a.string_val = self.h.schema(v)
                elif name == "nbox_annotation":
                    a.string_val = "/".join(self.h.scope(s) for s in v.split("/"))
                elif name == "pg_name":
                    a.string_val = self.h.pg(v)
                elif name == "nbox_pg_desc":
                    a.string_val = self.h.pg_desc(v)
                elif name == "nbox_op":
                    if node_name is None or not self.h.op_allowed(node_name):
                        a.string_val = self.h.token("operator", v)
                elif name == "nbox_children":
                    new = self.children(v)
                    if new is None:  # unreadable: dropped (live replay then uses the recorded duration)
                        drop.append(a)
                        continue
                    a.string_val = new
                elif name not in KEPT_STRING_ATTRS and name not in STRIDE_ATTRS:
                    a.string_val = self.h.string_value(v)
            elif kind == "string_list":
                vals = [self.h.string_value(s) for s in a.string_list.values]
                del a.string_list.values[:]
                a.string_list.values.extend(vals)
            elif kind == "bytes_val":
                a.bytes_val = self.h.token("string_value", a.bytes_val.hex()).encode()
            elif kind == "bytes_list":
                bl = [self.h.token("string_value", b.hex()).encode() for b in a.bytes_list.values]
                del a.bytes_list.values[:]
                a.bytes_list.values.extend(bl)
            if a.doc_string:
                a.doc_string = self.h.token("string_value", a.doc_string)
        for a in drop:
            attrs.remove(a)

    def node(self, node: pb.Node) -> pb.Node:
        orig = node.name
        if node.type == pb.METADATA_NODE and orig == "## process_group:init ##":
            self.pg_init(node)
            self.attrs(node.attr, orig)
            return node
        is_kernel = any(a.name == "nbox_gpu_kind" for a in node.attr)
        node.name = self.h.kernel(orig) if is_kernel else self.h.op(orig)
        fn = self.h.string_value if is_kernel else self.value_fn(orig)
        for side in ("inputs", "outputs"):
            if node.HasField(side):  # an absent IOInfo stays absent
                self.io(getattr(node, side), fn)
        self.attrs(node.attr, orig)
        return node


def _anon_manifest_value(h: _Hasher, section: str, key: str, value: Any) -> Any:
    """One manifest value under ``section.key``: kept when allowlisted, else its strings hashed."""
    if section == "job" and key == "process_groups" and isinstance(value, dict):
        return {h.pg(str(k)): v for k, v in value.items()}
    if isinstance(value, str) and key in MANIFEST_KEEP.get(section, frozenset()):
        return value
    low = key.lower()
    if key == "args" or any(w in low for w in ("argv", "cmd", "command", "env")):
        category = "arg"
    elif "host" in low or "node_name" in low:
        category = "host"
    elif key in ("script", "converted_from") or any(w in low for w in ("path", "file", "dir", "cwd", "user")):
        category = "path"
    else:
        category = "text"

    def fn(s: str) -> str:
        if s == "" or (category == "text" and _NUMERIC.match(s)):
            return s
        return h.token("path" if category == "text" and ("/" in s or "\\" in s) else category, s)

    if isinstance(value, dict):
        if category in ("arg", "host", "path"):  # keys of an environment are as private as its values
            return {h.token(category, str(k)): _walk_strings(v, fn) for k, v in value.items()}
        return {k: _anon_manifest_value(h, section, str(k), v) for k, v in value.items()}
    return _walk_strings(value, fn)


def _anon_manifest(m: Manifest, h: _Hasher, config: AnonymizeConfig, key_id: str) -> Manifest:
    sections = {s: {k: _anon_manifest_value(h, s, k, v) for k, v in getattr(m, s).items()}
                for s in ("producer", "hardware", "job", "observed", "capture")}
    extra = {k: _anon_manifest_value(h, "extra", k, v) for k, v in m.extra.items()
             if k != "migrated_from"}
    if config.level == "strict":
        extra["replay_compute"] = "recorded"
    return Manifest(producer=sections["producer"], hardware=sections["hardware"], job=sections["job"],
                    observed=sections["observed"], capture=sections["capture"], complete=m.complete,
                    kind=m.kind, anonymized={"level": config.level, "key_id": key_id, "nbox": __version__},
                    extra=extra)


_TRACE_FILE = re.compile(r"^" + re.escape(TRACE_PREFIX) + r"\.[0-9]+\.et\Z")


def anonymize_bundle(bundle: str | os.PathLike[str], out: str | os.PathLike[str],
                     config: AnonymizeConfig = AnonymizeConfig(), *, overwrite: bool = False) -> AnonymizeResult:
    """Write an anonymized copy of ``bundle`` to ``out`` (module docstring); the input is never modified.

    Files the manifest lists other than the rank traces and ``comm_group.json`` are left out (default
    deny) and named in ``dropped_files``.

    Raises:
        AnonymizeError: the bundle does not verify, or ``out`` is the bundle itself.
        NboxError subclasses: an unreadable bundle or trace, an unwritable ``out``.
    """
    root = Path(bundle)
    target = Path(out)
    manifest = read_manifest(root)
    problems = verify_files(root, manifest)
    if problems:
        raise AnonymizeError(f"{root}: does not verify, refusing to anonymize it: {problems[0]}"
                             + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    if target.resolve() == root.resolve() or root.resolve() in target.resolve().parents:
        raise AnonymizeError(f"{target}: the output must not be the input bundle or inside it")
    key = config.key if config.key is not None else os.urandom(32)
    key_id = hashlib.sha256(key).hexdigest()[:12]
    h = _Hasher(key)
    strict = config.level == "strict"
    files: dict[str, Path | bytes] = {}
    dropped: list[str] = []
    with tempfile.TemporaryDirectory(prefix=".nbox-anonymize-") as tmp:
        for entry in manifest.files:
            src = root / entry.path
            if _TRACE_FILE.match(entry.path):
                dest = Path(tmp) / entry.path.replace("/", "_")
                an = _Anonymizer(h, strict)
                with EtReader(src) as reader:
                    meta = pb.GlobalMetadata()
                    meta.CopyFrom(reader.metadata)
                    an.attrs(meta.attr, None)
                    with EtWriter(dest, meta, compress=reader.compressed) as writer:
                        writer.write_all(an.node(n) for n in reader)
                files[entry.path] = dest
            elif entry.path == COMM_GROUP_NAME:
                try:
                    groups = json.loads(src.read_bytes())
                except (ValueError, RecursionError) as exc:
                    raise AnonymizeError(f"{src}: not valid JSON: {str(exc)[:120]}") from None
                if not isinstance(groups, dict):
                    raise AnonymizeError(f"{src}: expected a JSON object {{pg_name: [ranks]}}")
                files[entry.path] = (json.dumps({h.pg(str(k)): v for k, v in groups.items()}, sort_keys=True)
                                     + "\n").encode()
            else:
                dropped.append(entry.path)
        new_manifest = _anon_manifest(manifest, h, config, key_id)
        write_bundle(target, new_manifest, files, overwrite=overwrite)
    return AnonymizeResult(out=target, level=config.level, key_id=key_id,
                           replaced={k: len(v) for k, v in sorted(h.seen.items())},
                           kept_operators=len(h.kept_ops), dropped_shapes=strict, dropped_files=tuple(dropped))


def _gunzip(raw: bytes) -> bytes | None:
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as f:
            return f.read(_MAX_GUNZIP)
    except (OSError, EOFError):
        return None


def find_strings(bundle: str | os.PathLike[str], secrets: Iterable[str]) -> list[tuple[str, str]]:
    """Every ``(file, secret)`` where ``secret`` occurs in a file of ``bundle`` (bundle-relative path).

    Searches the raw bytes of every regular file and the inflated content of any gzip file, for the
    UTF-8 text of each secret and its JSON-escaped form. Case-sensitive.
    """
    wanted = [s for s in secrets if s]
    hits: list[tuple[str, str]] = []
    root = Path(bundle)
    for p in sorted(root.rglob("*")):
        if p.is_symlink() or not p.is_file():
            continue
        raw = p.read_bytes()
        blobs = [raw]
        if raw[:2] == b"\x1f\x8b":
            inflated = _gunzip(raw)
            if inflated is not None:
                blobs.append(inflated)
        rel = p.relative_to(root).as_posix()
        for s in wanted:
            forms = {s.encode("utf-8", "surrogatepass"), json.dumps(s)[1:-1].encode()}
            if any(f in b for f in forms for b in blobs):
                hits.append((rel, s))
    return hits
