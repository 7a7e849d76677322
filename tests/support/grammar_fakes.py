"""Grammar stand-ins shared by the scheduling tests: a compiled grammar and a matcher that allows every token."""
from __future__ import annotations

from grammar.backend import CompiledGrammar, Grammar


class FakeCompiled(CompiledGrammar):
    num_bytes = 64


class AnyTokenGrammar(Grammar):
    def fill_bitmask(self, bitmask, row):
        bitmask[row] = -1

    def accept_tokens(self, token_ids):
        return True

    def rollback(self, num_tokens):
        pass

    def is_terminated(self):
        return False

    def jump_forward_token_ids(self):
        return []
