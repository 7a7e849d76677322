"""The engine's front end, in the caller's process: core client, output processing, (de)tokenizing.

Imports no torch; the core it drives does, in its own process (or, in-process, in a thread).
"""
