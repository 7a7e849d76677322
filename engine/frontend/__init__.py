"""The engine's front end, in the caller's process: the core client, output processing, (de)tokenizing. Never loads torch."""
