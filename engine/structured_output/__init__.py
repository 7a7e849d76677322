"""Structured output on the engine's side: grammar compiles, per-request grammar state, bitmask fills."""
