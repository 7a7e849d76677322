"""Which requests compute which tokens each step, and the per-request state the scheduler owns."""
