"""Speculative decoding: who drafts, what (n-gram and text proposers), how long, and each request's draft state."""
