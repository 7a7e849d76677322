"""The `formwork` command, assembled above the packages whose sub-commands it offers."""
