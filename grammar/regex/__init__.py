"""Regular expressions read by hand, library-free: parsed.py is the one parsed form (ECMA-262
syntax) that the length analyses (length_pattern.implied_lengths, length_caps), the suffixes
(suffixes.py: the ways to finish a pattern) and the EBNF conversion (grammar/xgrammar/regex_ebnf.py)
walk, with characters.py saying what an escape or a class stands for; pieces.py is the lexer of the
rules that rewrite pattern text; repeat_counts.py finds counts a regex library would wrap."""
