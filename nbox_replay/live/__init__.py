"""nbox_replay/live."""
