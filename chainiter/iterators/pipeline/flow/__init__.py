"""Pure bookkeeping and policies of the pipeline: no memory, no threads,
no processes."""
