"""emulator_core: what-if scenarios, the network model, calibration and the ``nbox`` backend.

Rooms, bottom to top: ``network`` (closed forms, no scenario), ``scenario`` (the what-if), ``astra`` (ASTRA-sim's
files), ``pricing`` (a scenario's collectives priced and answered), ``calibration`` (``nbox calibrate``), ``device``
(a call held on the device) and ``backend`` (the torch.distributed backend; ``_autoload`` is its entry point). Each
room's ``__init__`` is its door: other rooms and layers import only what it exports. Used by ``nbox scenario``,
``nbox calibrate``, ``nbox replay``, ``nbox sweep`` and ``nbox emulate``; it never imports ``nbox_record`` or
``nbox_replay``.
"""
