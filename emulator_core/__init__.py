"""emulator_core: what-if scenarios, topologies, collective cost models and the ``nbox`` backend.

Empty for now: no command uses it yet (the emulator-core issue builds it). It never imports
``nbox_record`` or ``nbox_replay``.
"""
