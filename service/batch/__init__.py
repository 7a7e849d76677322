"""Batch jobs: OpenAI batch files run through an Executor, resumable, with progress."""
