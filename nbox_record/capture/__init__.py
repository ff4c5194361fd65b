"""nbox_record/capture."""
