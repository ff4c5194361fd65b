"""nbox_trace: the base every other nbox package stands on.

Its own modules: the error family (``errors``), units, progress, bounded JSON reading (``jsonio``), the one atomic
writer (``files``), the format contract the writers and the checker share (``contract``), the recorded mesh
(``mesh``), results shared across nodes (``share``), a thread's CPU time (``threadtime``) and rooms' lazy doors
(``doors``). Its rooms: the Chakra ET model (``chakra``), the trace checker (``check``), the bundle format and what
is done with bundles (``bundle``), the one launcher of ranks (``launch``) and, for tests and benches, a cluster of
network namespaces on one machine (``testbed``). It imports neither torch nor typer nor rich, and nothing of nbox
above it.
"""

__version__ = "0.1.0"
