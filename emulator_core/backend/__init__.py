"""emulator_core/backend."""
