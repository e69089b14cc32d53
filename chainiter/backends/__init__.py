"""Where arrays live: the host (numpy) or a GPU (cupy, optional)."""
