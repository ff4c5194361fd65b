"""nbox_trace/bundle."""
