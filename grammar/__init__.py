"""Everything about output constraints. Only grammar/xgrammar_backend.py imports xgrammar."""
