"""Worker threads, and ``MultithreadIterator``."""
