"""nbox_replay/virtual."""
