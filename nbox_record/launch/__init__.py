"""nbox_record/launch."""
