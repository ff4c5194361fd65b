"""emulator_core/calibration."""
