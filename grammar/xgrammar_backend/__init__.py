"""xgrammar behind the GrammarBackend ABC. The only package in Formwork that imports xgrammar:
backend.py compiles, matcher.py runs one request's matcher, conversion.py reads constraint text.

Choices made here (docs/constraints-keywords.md has the measurements behind them):

* JSON whitespace follows the constraint's mode (grammar.backend.JSON_WHITESPACE_MODES): fixed
  separators (compact "," ":" or spaced ", " ": "), or free whitespace, bounded per gap or not.
* xgrammar's strict_mode is always on: properties and items a schema does not declare are not
  allowed, so the model cannot invent keys. That only narrows what a schema allows; the shapes
  where it would narrow to nothing are rewritten first (schema_check.normalize).
  Our Constraint.strict is a different thing: whether a keyword we cannot enforce is an error.
* Object properties come out in the schema's declared order (xgrammar's any_order=False).
* Unsupported keywords are found by schema_check before compiling, and xgrammar's own warnings
  (printed by its C++ code) are captured and turned into findings too; in strict mode either one
  is an error, so nothing is silently under-constrained.
"""
from grammar.xgrammar_backend.backend import XGrammarBackend
from grammar.xgrammar_backend.conversion import choice_ebnf
from grammar.xgrammar_backend.matcher import (XGrammarCompiled, XGrammarGrammar, apply_bitmask_xgrammar,
                                              hf_logits_processor)

__all__ = ["XGrammarBackend", "XGrammarCompiled", "XGrammarGrammar", "apply_bitmask_xgrammar", "choice_ebnf",
           "hf_logits_processor"]
