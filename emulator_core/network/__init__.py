"""emulator_core/network."""
