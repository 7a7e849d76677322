"""Model architectures over the attention backends and the CPU kernels."""
