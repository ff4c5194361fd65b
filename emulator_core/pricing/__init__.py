"""emulator_core/pricing."""
