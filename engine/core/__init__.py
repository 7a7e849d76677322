"""The engine core: one step at a time over the scheduler and the worker, in its own process or a thread."""
