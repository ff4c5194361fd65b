"""emulator_core: what-if scenarios, topologies, collective cost models and the ``nbox`` backend.

Used by ``nbox scenario``, ``nbox calibrate``, ``nbox replay``, ``nbox sweep`` and ``nbox emulate``. It never
imports ``nbox_record`` or ``nbox_replay``.
"""
