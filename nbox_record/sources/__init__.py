"""nbox_record/sources."""
