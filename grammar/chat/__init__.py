"""What chat models write around a constrained answer: tool-call syntaxes and think markers.
Pure data; no grammar library and no other grammar module."""
