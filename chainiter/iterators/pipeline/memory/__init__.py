"""Batches in memory: the slots, their layouts, and how a worker writes
a batch and the main thread reads it back."""
