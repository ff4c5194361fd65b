"""nbox_replay/inputs."""
