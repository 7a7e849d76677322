"""Regular expressions read by hand, library-free: parsed.py is the one parsed form the length
analyses share (length_pattern.implied_lengths, length_caps); pieces.py the lexer of the rules that
rewrite pattern text; suffixes.py the ways to finish a pattern; repeat_counts.py its large counts."""
