"""Lark grammars, which vLLM's `guided_grammar` users send, translated to xgrammar's EBNF.

Supported: rules and terminals (the ?/! rule prefixes, priorities and `-> alias` are dropped:
they shape Lark's tree, not the language), alternatives (also on continuation lines starting
with `|`), "literals" (with the `i` flag), "a".."z" ranges, /regex/ terminals (grammar/xgrammar/regex_ebnf.py),
groups ( ), optional [ ], the ? * + and ~ n / ~ n..m operators, `%import common.NAME` (and
`%import common (A, B)`) for the terminals of Lark's common.lark, and `%ignore` (the ignored
terminals may appear between any two items of a rule, and around the whole output).
Refused with a LarkGrammarError naming the line: other imports, templates, %declare/%override/%extend.
Pure Python; the translation starts at the rule `start`, as Lark does.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from grammar.constraint import GRAMMAR_SYNTAXES
from grammar.xgrammar.regex_ebnf import char_class, class_char, regex_to_ebnf, string_literal

START_RULE = "start"
_IGNORE_RULE = "lark_ignored"

# Lark's common.lark, as EBNF (the terminals grammars import)
_COMMON = {
    "DIGIT": "[0-9]",
    "HEXDIGIT": "[a-fA-F0-9]",
    "INT": "[0-9]+",
    "SIGNED_INT": '[+\\-]? [0-9]+',
    "DECIMAL": '([0-9]+ "." [0-9]* | "." [0-9]+)',
    "FLOAT": '([0-9]+ [eE] [+\\-]? [0-9]+ | ([0-9]+ "." [0-9]* | "." [0-9]+) ([eE] [+\\-]? [0-9]+)?)',
    "SIGNED_FLOAT": "[+\\-]? FLOAT",
    "NUMBER": "(FLOAT | INT)",
    "SIGNED_NUMBER": "[+\\-]? NUMBER",
    "ESCAPED_STRING": '"\\"" ([^"\\\\\\n] | "\\\\" [^\\n])* "\\""',
    "LCASE_LETTER": "[a-z]",
    "UCASE_LETTER": "[A-Z]",
    "LETTER": "[a-zA-Z]",
    "WORD": "[a-zA-Z]+",
    "CNAME": "[_a-zA-Z] [_a-zA-Z0-9]*",
    "WS_INLINE": "[ \\t]+",
    "WS": "[ \\t\\f\\r\\n]+",
    "CR": '"\\r"',
    "LF": '"\\n"',
    "NEWLINE": '("\\r"? "\\n")+',
}
_COMMON_NEEDS = {"SIGNED_FLOAT": ("FLOAT",), "NUMBER": ("FLOAT", "INT"), "SIGNED_NUMBER": ("NUMBER", "FLOAT", "INT")}

_TOKEN = re.compile(r"""
    (?P<comment>//[^\n]*)
  | (?P<newline>\n)
  | (?P<space>[ \t\r\f]+)
  | (?P<string>"(?:\\.|[^"\\\n])*"i?)
  | (?P<regex>/(?:\\.|[^/\\\n])+/[imslux]*)
  | (?P<directive>%[a-z]+)
  | (?P<arrow>->)
  | (?P<range>\.\.)
  | (?P<name>[?!]?[A-Za-z_][A-Za-z_0-9]*(?:\.-?\d+)?)
  | (?P<number>\d+)
  | (?P<op>[:|()\[\]?*+~,{}.])
""", re.VERBOSE)
_EBNF_RULE = re.compile(r"^\s*[A-Za-z_][\w-]*\s*::=", re.MULTILINE)
_LARK_RULE = re.compile(r"^\s*[?!]?[A-Za-z_]\w*(\.-?\d+)?\s*:(?!:)|^\s*%(import|ignore)\b", re.MULTILINE)


class LarkGrammarError(ValueError):
    """A Lark grammar this translator does not take; the message names the line and the problem."""


def detect_syntax(text: str) -> str:
    """"lark" when the grammar is written in Lark (rules `name: ...`), else "ebnf"."""
    if _EBNF_RULE.search(text):
        return "ebnf"
    return "lark" if _LARK_RULE.search(text) else "ebnf"


def to_ebnf(text: str, syntax: str = "auto") -> str:
    """The grammar in xgrammar's EBNF: unchanged when it is EBNF, translated when it is Lark."""
    if syntax not in GRAMMAR_SYNTAXES:
        raise ValueError(f"unknown grammar syntax {syntax!r}; expected one of {', '.join(GRAMMAR_SYNTAXES)}")
    if syntax == "auto":
        syntax = detect_syntax(text)
    return lark_to_ebnf(text) if syntax == "lark" else text


def lark_to_ebnf(text: str) -> str:
    """Translate a Lark grammar; LarkGrammarError if it uses what is not supported."""
    return _Translator(_tokenize(text)).translate()


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    line: int


def _tokenize(text: str) -> list[_Token]:
    tokens, pos, line = [], 0, 1
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            raise LarkGrammarError(f"Lark grammar line {line}: unexpected character {text[pos]!r}")
        kind = match.lastgroup
        assert kind is not None
        if kind not in ("comment", "space"):
            tokens.append(_Token(kind, match.group(), line))
        line += kind == "newline"
        pos = match.end()
    tokens.append(_Token("newline", "\n", line))
    return tokens


class _Translator:
    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.rules: dict[str, str] = {}  # Lark name -> EBNF body
        self.terminals: set[str] = set()  # names whose items are lexical (no %ignore between them)
        self.imported: set[str] = set()
        self.ignored: list[str] = []  # EBNF expressions of the %ignore'd terminals
        self.referenced: dict[str, int] = {}  # name -> line of its first use
        self.current_rule_is_terminal = False
        self.has_ignore = any(token.text == "%ignore" for token in tokens)

    def error(self, message: str, token: _Token | None = None) -> LarkGrammarError:
        token = token or self._peek()
        return LarkGrammarError(f"Lark grammar line {token.line}: {message}")

    def _peek(self) -> _Token:
        return self.tokens[self.pos]

    def _next(self) -> _Token:
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def _skip_newlines(self) -> None:
        while self.pos < len(self.tokens) and self._peek().kind == "newline":
            self.pos += 1

    def _continues(self) -> bool:
        """After a newline, an alternative continues the definition when the next line starts with |."""
        ahead = self.pos
        while ahead < len(self.tokens) and self.tokens[ahead].kind == "newline":
            ahead += 1
        if ahead < len(self.tokens) and self.tokens[ahead].text == "|":
            self.pos = ahead
            return True
        return False

    # ---- definitions --------------------------------------------------------------------------

    def translate(self) -> str:
        while True:
            self._skip_newlines()
            if self.pos >= len(self.tokens):
                break
            token = self._peek()
            if token.kind == "directive":
                self._directive()
            elif token.kind == "name":
                self._definition()
            else:
                raise self.error(f"expected a rule, a terminal or a directive, got {token.text!r}")
        if START_RULE not in self.rules:
            raise LarkGrammarError(f"a Lark grammar needs a '{START_RULE}' rule (where Lark starts)")
        for name, line in self.referenced.items():
            if name not in self.rules:
                raise LarkGrammarError(f"Lark grammar line {line}: '{name}' is used but never defined "
                                       f"(or %import'ed)")
        return self._emit()

    def _definition(self) -> None:
        name_token = self._next()
        name = _bare_name(name_token.text)
        if self._peek().text == "{":
            raise self.error(f"'{name}' is a template rule, which is not supported")
        if self._next().text != ":":
            raise self.error(f"expected ':' after '{name}'", name_token)
        if name in self.rules:
            raise self.error(f"'{name}' is defined twice", name_token)
        self.current_rule_is_terminal = name.lstrip("_")[:1].isupper()
        if self.current_rule_is_terminal:
            self.terminals.add(name)
        self.rules[name] = self._expansions(top=True)

    def _directive(self) -> None:
        token = self._next()
        if token.text == "%import":
            self._import(token)
        elif token.text == "%ignore":
            self.current_rule_is_terminal = True
            self.ignored.append(self._expansions(top=True))
        else:
            raise self.error(f"{token.text} is not supported", token)

    def _import(self, token: _Token) -> None:
        module = self._next()
        if module.text != "common":
            raise self.error(f"only %import common.NAME is supported, not {module.text!r}", token)
        if self._peek().text == ".":
            self._next()
            names = [self._next().text]
        else:  # %import common (A, B)
            if self._next().text != "(":
                raise self.error("expected %import common.NAME or %import common (NAME, ...)", token)
            names = []
            while self._peek().text != ")":
                item = self._next()
                if item.kind == "name":
                    names.append(item.text)
                elif item.text != ",":
                    raise self.error(f"unexpected {item.text!r} in %import", item)
            self._next()
        alias = None
        if self._peek().kind == "arrow":
            self._next()
            alias = self._next().text
        for name in names:
            if name not in _COMMON:
                raise self.error(f"common.{name} is not one of the supported common terminals "
                                 f"({', '.join(sorted(_COMMON))})", token)
            for needed in (name, *_COMMON_NEEDS.get(name, ())):
                self.rules.setdefault(needed, _COMMON[needed])
                self.terminals.add(needed)
            if alias is not None:
                self.rules[alias] = name
                self.terminals.add(alias)

    # ---- expressions --------------------------------------------------------------------------

    def _expansions(self, top: bool = False) -> str:
        alternatives = [self._alternative()]
        while True:
            if self._peek().text == "|":
                self._next()
            elif self._peek().kind == "newline" and self._continues():
                self._next()
            else:
                break
            alternatives.append(self._alternative())
        if top and self._peek().kind != "newline":
            raise self.error(f"unexpected {self._peek().text!r}")
        return alternatives[0] if len(alternatives) == 1 else "(" + " | ".join(alternatives) + ")"

    def _alternative(self) -> str:
        items: list[str] = []
        while self._peek().kind != "newline" and self._peek().text not in ("|", ")", "]"):
            if self._peek().kind == "arrow":  # `-> alias` names the tree node only
                self._next()
                self._next()
                continue
            items.append(self._item())
        if not items:
            return '""'
        separator = " " if self.current_rule_is_terminal or not self.has_ignore else f" {_IGNORE_RULE} "
        return items[0] if len(items) == 1 else "(" + separator.join(items) + ")"

    def _item(self) -> str:
        atom = self._atom()
        while True:
            op = self._peek().text
            if op in ("?", "*", "+"):
                self._next()
                atom = f"({atom}){op}" if atom.endswith(("?", "*", "+", "}")) else atom + op
            elif op == "~":
                self._next()
                low = self._number()
                high = low
                if self._peek().kind == "range":
                    self._next()
                    high = self._number()
                atom = f"({atom}){{{low},{high}}}" if atom.endswith(("?", "*", "+", "}")) else f"{atom}{{{low},{high}}}"
            else:
                return atom

    def _number(self) -> str:
        token = self._next()
        if token.kind != "number":
            raise self.error(f"expected a number after '~', got {token.text!r}", token)
        return token.text

    def _atom(self) -> str:
        token = self._next()
        if token.text in ("(", "["):
            inner = self._expansions()
            closing = ")" if token.text == "(" else "]"
            if self._next().text != closing:
                raise self.error(f"missing '{closing}'", token)
            return f"({inner})" if closing == ")" else f"({inner})?"
        if token.kind == "string":
            if self._peek().kind == "range":
                self._next()
                high = self._next()
                if high.kind != "string":
                    raise self.error("expected a string after '..'", high)
                return _range(token, high, self)
            return _string(token, self)
        if token.kind == "regex":
            return _regex(token, self)
        if token.kind == "name":
            name = _bare_name(token.text)
            self.referenced.setdefault(name, token.line)
            return _ebnf_name(name)
        raise self.error(f"unexpected {token.text!r}", token)

    # ---- output -------------------------------------------------------------------------------

    def _emit(self) -> str:
        root = _ebnf_name(START_RULE)
        lines = []
        if self.ignored:
            lines.append(f"root ::= {_IGNORE_RULE} {root} {_IGNORE_RULE}")
            lines.append(f"{_IGNORE_RULE} ::= ({' | '.join(self.ignored)})*")
        else:
            lines.append(f"root ::= {root}")
        lines += [f"{_ebnf_name(name)} ::= {body}" for name, body in self.rules.items()]
        return "\n".join(lines) + "\n"


def _bare_name(text: str) -> str:
    """A definition's name without the ?/! prefix and the .priority suffix."""
    return text.lstrip("?!").split(".")[0]


def _ebnf_name(name: str) -> str:
    # "root" is xgrammar's start symbol, and the ignore rule's name is ours
    return f"lark_{name}" if name in ("root", _IGNORE_RULE) else name


def _string_value(token: _Token, translator: _Translator) -> tuple[str, bool]:
    literal, insensitive = (token.text[:-1], True) if token.text.endswith("i") else (token.text, False)
    try:
        return ast.literal_eval(literal), insensitive
    except (SyntaxError, ValueError) as e:
        raise translator.error(f"bad string {token.text}: {e}", token) from None


def _string(token: _Token, translator: _Translator) -> str:
    value, insensitive = _string_value(token, translator)
    if not insensitive:
        return string_literal(value)
    parts = [char_class(class_char(c.lower()) + class_char(c.upper())) if c.lower() != c.upper()
             else string_literal(c) for c in value]
    return parts[0] if len(parts) == 1 else "(" + " ".join(parts) + ")"


def _range(low_token: _Token, high_token: _Token, translator: _Translator) -> str:
    low, _ = _string_value(low_token, translator)
    high, _ = _string_value(high_token, translator)
    if len(low) != 1 or len(high) != 1 or ord(low) > ord(high):
        raise translator.error(f"bad range {low_token.text}..{high_token.text}", low_token)
    return char_class(f"{class_char(low)}-{class_char(high)}")


def _regex(token: _Token, translator: _Translator) -> str:
    body, _, flags = token.text[1:].rpartition("/")
    if flags:
        raise translator.error(f"regex flags ({flags}) are not supported in {token.text}", token)
    try:
        return regex_to_ebnf(body.replace("\\/", "/"))
    except ValueError as e:
        raise translator.error(str(e), token) from None
