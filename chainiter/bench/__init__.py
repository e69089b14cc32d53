"""Benchmarks of chainiter's iterators against PyTorch's DataLoader.

Run ``python -m chainiter.bench --help``.
"""
