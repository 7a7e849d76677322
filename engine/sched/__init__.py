"""Which requests compute which tokens each step, and their per-request state (grammars included)."""
