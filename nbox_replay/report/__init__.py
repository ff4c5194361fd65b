"""nbox_replay/report."""
