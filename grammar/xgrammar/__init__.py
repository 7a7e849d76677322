"""xgrammar behind the GrammarBackend ABC: the only package in Formwork that imports xgrammar
or knows its formats. backend.py compiles, matcher.py runs one request's matcher (matcher_cursor.py
shows it to the closing search), conversion.py reads constraint text; regex_ebnf.py and
lark_grammar.py write its EBNF, structural_tags.py its structural-tag JSON, decimal_numbers.py
number rules into its grammar text; output_bounds.py reads its serialize_json, log_capture.py its
C++ warnings, schema_gaps.py lists what 0.2.9 does not enforce. Importers name the module (the
package imports nothing), so the pure-Python translators load without torch or xgrammar.

Choices made here (docs/constraints-keywords.md has the measurements behind them):

* JSON whitespace follows the constraint's mode (grammar.constraint.JSON_WHITESPACE_MODES): fixed
  separators (compact "," ":" or spaced ", " ": "), or free whitespace, bounded per gap or not.
* xgrammar's strict_mode is always on: properties and items a schema does not declare are not
  allowed, so the model cannot invent keys. That only narrows what a schema allows; the shapes
  where it would narrow to nothing are rewritten first (schema_gaps.normalize).
  Our Constraint.strict is a different thing: whether a keyword we cannot enforce is an error.
* Object properties come out in the schema's declared order (xgrammar's any_order=False).
* Unsupported keywords are found by schema_gaps before compiling, and xgrammar's own warnings
  (printed by its C++ code) are captured and turned into findings too; in strict mode either one
  is an error, so nothing is silently under-constrained.
"""
