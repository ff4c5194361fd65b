"""emulator_core/scenario."""
