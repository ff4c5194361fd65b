"""nbox_trace/launch."""
