"""Everything about output constraints. Only grammar/xgrammar_backend/ imports xgrammar."""
