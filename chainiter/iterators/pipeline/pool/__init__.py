"""The pool of workers, of either kind, and what a worker does with a
task."""
