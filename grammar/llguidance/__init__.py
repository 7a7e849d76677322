"""llguidance behind the GrammarBackend ABC: the only package in Formwork that imports llguidance.
backend.py compiles, matcher.py runs one request's matcher (and shows it to the closing search),
lark_text.py writes the Lark grammars llguidance reads (choices, think sections), structural_lark.py
those of structural tags and tool calls,
json_options.py turns a schema and its whitespace mode into llguidance's JSON input,
output_bounds.py reads the output a constraint needs from its text. Importers name the module
(the package imports nothing).

Why a second backend: llguidance builds token masks lazily, one step at a time, so a new schema
answers in about a millisecond where xgrammar compiles for tens of ms to seconds; and the two
refuse different schemas (grammar/selection.py picks per request). What it does not do, per
runtime feature, is in docs/constraints.md ("The llguidance backend").
"""
