"""nbox_record/handoff."""
