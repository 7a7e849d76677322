"""Lark grammars -> xgrammar EBNF (grammar/xgrammar/lark_grammar.py, grammar/xgrammar/regex_ebnf.py), and compiled
through the real backend: the strings Lark's grammar takes are exactly the ones the output allows."""
from __future__ import annotations

import re

import pytest
from grammar_factories import accepts, make_backend, make_constraint

from grammar.backend import GrammarError
from grammar.xgrammar.lark_grammar import LarkGrammarError, detect_syntax, lark_to_ebnf, to_ebnf
from grammar.xgrammar.regex_ebnf import regex_to_ebnf

# vLLM's own test fixture (tests/entrypoints/conftest.py, sample_sql_lark)
VLLM_SQL_LARK = """
start: select_statement

select_statement: "SELECT" column "from" table "where" condition

column: "col_1" | "col_2"

table: "table_1" | "table_2"

condition: column "=" number

number: "1" | "2"
"""

CALCULATOR_LARK = r"""
?start: sum
?sum: product
    | sum "+" product   -> add
    | sum "-" product   -> sub
?product: atom
    | product "*" atom  -> mul
?atom: NUMBER           -> number
     | "-" atom         -> neg
     | NAME             -> var
     | "(" sum ")"
NAME: /[a-z_][a-z0-9_]*/
%import common.NUMBER
%import common.WS_INLINE
%ignore WS_INLINE   // spaces between tokens
"""


def compiled(grammar: str):
    return make_backend().compile(make_constraint("grammar", grammar))


def test_syntax_is_detected():
    assert detect_syntax(VLLM_SQL_LARK) == "lark"
    assert detect_syntax(CALCULATOR_LARK) == "lark"
    assert detect_syntax('root ::= "a" | "b"') == "ebnf"
    assert detect_syntax('root ::= "x: y"\nx ::= "a"') == "ebnf"  # a ':' inside an EBNF literal
    assert to_ebnf('root ::= "a"') == 'root ::= "a"'
    assert to_ebnf('start: "a"', syntax="lark").startswith("root ::= start")
    with pytest.raises(ValueError, match="unknown grammar syntax 'bnf'"):
        to_ebnf("x", syntax="bnf")


def test_the_vllm_sql_fixture_translates_and_constrains():
    ebnf = lark_to_ebnf(VLLM_SQL_LARK)
    assert ebnf.splitlines()[:2] == ["root ::= start", "start ::= select_statement"]
    grammar = compiled(VLLM_SQL_LARK)  # through the grammar kind: the same path gRPC takes
    assert accepts(grammar, "SELECTcol_1fromtable_2wherecol_2=1")
    assert not accepts(grammar, "SELECTcol_3fromtable_2wherecol_2=1")
    assert not accepts(grammar, "SELECT col_1 from table_2 where col_2=1")  # no %ignore: no spaces


def test_ignore_aliases_priorities_and_common_imports():
    grammar = compiled(CALCULATOR_LARK)
    for good in ("1+2", "x * (y - 3.5e2)", "  -a ", "-(1)*2"):
        assert accepts(grammar, good), good
    for bad in ("1+", "X", "1 2", "(1"):
        assert not accepts(grammar, bad), bad


@pytest.mark.parametrize("lark, good, bad", [
    ('start: "a" [ "b" ] "c"+', ["ac", "abccc"], ["ab", "abbc"]),
    ('start: ("x" | "y")* "!"', ["!", "xyx!"], ["xz!"]),
    ('start: "ab" ~ 2', ["abab"], ["ab", "ababab"]),
    ('start: D ~ 1..3\nD: "0".."9"', ["7", "123"], ["", "1234", "a"]),
    ('start: "select"i', ["SeLeCt", "select"], ["selec"]),
    ('start: WORD\n%import common (WORD)', ["Hello"], ["he11o"]),
    ('start: ESCAPED_STRING\n%import common.ESCAPED_STRING', ['"a \\"b\\" c"'], ['"a" b"']),
    ('start: SIGNED_NUMBER\n%import common.SIGNED_NUMBER', ["-1.5e3", "+2", "7"], ["1.2.3"]),
    ('start: item ("," item)*\nitem: /[0-9]{2}/ | /"[^"]*"/', ['12,"x, y"'], ["1", '12,"x'], ),
    ('start: root\nroot: "r"', ["r"], ["rr"]),  # a rule named like xgrammar's start symbol
    ('start: "a"\n    | "b"\n    | "c"', ["a", "c"], ["ab"]),
])
def test_lark_constructs(lark, good, bad):
    grammar = compiled(lark)
    for text in good:
        assert accepts(grammar, text), (lark, text)
    for text in bad:
        assert not accepts(grammar, text), (lark, text)


@pytest.mark.parametrize("lark, message", [
    ('statement: "a"', "needs a 'start' rule"),
    ("start: item", "line 1: 'item' is used but never defined"),
    ('start: "a"\nstart: "b"', "line 2: 'start' is defined twice"),
    ('start: X\n%import python.X', "only %import common.NAME is supported"),
    ('start: X\n%import common.NOPE', "common.NOPE is not one of the supported common terminals"),
    ('start: "a"\n%declare X', "%declare is not supported"),
    ('start: /ab(?=c)/', r"line 1: regex /ab\(\?=c\)/: a lookaround"),
    ('start: /a/i', r"regex flags \(i\) are not supported"),
    ('start: "a"\n_sep{x}: x', "'_sep' is a template rule"),
    ('start: "a" )', r"unexpected '\)'"),
    ('start: "a" @', "unexpected character '@'"),
])
def test_unsupported_lark_is_refused_with_its_line(lark, message):
    with pytest.raises(LarkGrammarError, match=message):
        lark_to_ebnf(lark)


def test_the_backend_names_a_refused_lark_grammar():
    with pytest.raises(GrammarError, match=r"grammar \(Lark\) is not supported: .*'item' is used but never defined"):
        compiled("start: item")


def test_a_named_syntax_is_the_only_one_read():
    backend = make_backend()
    lark = backend.compile(make_constraint("grammar", 'start: "a"', grammar_syntax="lark"))
    assert lark.kind == "grammar"
    with pytest.raises(GrammarError) as info:  # read as EBNF, this Lark text has no rule
        backend.compile(make_constraint("grammar", 'start: "a"', grammar_syntax="ebnf"))
    assert "Lark" not in str(info.value)
    assert make_constraint("grammar", "x", grammar_syntax="lark").cache_key != make_constraint("grammar", "x").cache_key
    with pytest.raises(ValueError, match="unknown grammar syntax 'bnf'"):
        make_constraint("grammar", "x", grammar_syntax="bnf").validate()


@pytest.mark.parametrize("pattern, good, bad", [
    (r"[a-z]+@[a-z]+\.com", ["bob@example.com"], ["bob@examplexcom"]),
    (r"(-)?(0|[1-9][0-9]*)(\.[0-9]+)?", ["-0.5", "12"], ["012", "1."]),
    (r"\d{2,}", ["12", "12345"], ["1"]),
    (r"\w+\s?\W", ["ab_1 !"], ["ab"]),
    (r"(?:ab|cd)*?x", ["abcdx", "x"], ["abx" + "c"]),
    (r"(?P<y>\d{4})-\d\d", ["2024-05"], ["24-05"]),
    (r"[^\n\]]+", ["a]"[:1], "x y"], ["a]"]),
    (r"^a.c$", ["abc", "a c"], ["a\nc"]),
    (r"[\d.\-]+", ["1.-2"], ["1,2"]),
    (r"\x41\u00e9\t", ["A\u00e9\t"], ["Ae\t"]),
])
def test_regex_terminals_match_what_python_matches(pattern, good, bad):
    for text in good + bad:  # the expectations themselves follow Python's re
        assert bool(re.fullmatch(pattern, text)) == (text in good), (pattern, text)
    grammar = compiled("root ::= " + regex_to_ebnf(pattern))
    for text in good:
        assert accepts(grammar, text), (pattern, text)
    for text in bad:
        assert not accepts(grammar, text), (pattern, text)


@pytest.mark.parametrize("pattern, message", [
    (r"a\1", "a backreference"),
    (r"\bword", "a word boundary"),
    (r"(?i)abc", "an inline flag"),
    (r"a^b", r"'\^' inside the pattern"),
    (r"a++", "a possessive quantifier"),
    (r"*a", "nothing to repeat"),
    (r"(ab", "missing '\\)'"),
    (r"ab)", "unbalanced '\\)'"),
    (r"[abc", "unterminated character class"),
    (r"[z-a]", "bad range z-a"),
])
def test_regexes_a_grammar_cannot_express_are_refused(pattern, message):
    with pytest.raises(ValueError, match=message):
        regex_to_ebnf(pattern)
