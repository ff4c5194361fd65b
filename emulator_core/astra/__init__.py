"""emulator_core/astra."""
