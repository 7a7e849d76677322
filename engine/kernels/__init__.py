"""Formwork's own CPU kernels (csrc/, built on first use) and the torch-level ops around them."""
