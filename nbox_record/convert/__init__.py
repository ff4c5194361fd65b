"""nbox_record/convert."""
