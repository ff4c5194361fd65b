"""emulator_core/device."""
