"""Regular expressions read by hand: their pieces, the ways to finish them, their lengths and
repeat counts. Library-free; used by the schema rewrite, the closing hints and the backend."""
