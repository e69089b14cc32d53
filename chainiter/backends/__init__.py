"""Where arrays live: the host (numpy), a GPU (cupy, optional) or torch
tensors (torch, optional)."""
