"""nbox_trace: the base every other nbox package stands on.

The error family (``errors``), the Chakra ET model (``chakra``), the format contract the writers and the checker
share (``contract``), the trace checker (``check``), the bundle format and what is done with bundles (``bundle``,
``archive``, ``bundle_verify``, ``bundle_inspect``, ``bundle_diff``, ``anonymize``), bounded JSON reading and atomic
writing (``jsonio``), the one launcher of ranks (``launch``, ``localrun``) and, for tests and benches, a cluster of
network namespaces on one machine (``testbed``). It imports neither torch nor typer nor rich,
and nothing of nbox above it.
"""

__version__ = "0.1.0"
