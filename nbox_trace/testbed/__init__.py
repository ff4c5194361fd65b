"""nbox_trace/testbed."""
