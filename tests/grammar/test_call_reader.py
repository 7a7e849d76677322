from grammar.chat.call_reader import scan_calls, skip_space


def _call_at(text: str, at: int):
    """A toy syntax: `@name;` is a call of `name` with no arguments; `@` without `;` is not complete."""
    end = text.find(";", at)
    return None if end < 0 else (end + 1, [(text[at + 1:end], "{}")])


def test_scan_calls_drops_separators_between_calls_and_keeps_other_text():
    assert scan_calls("hi @a; @b;\n", "@", _call_at, " \n") == ("hi ", [("a", "{}"), ("b", "{}")], None)


def test_scan_calls_stops_at_an_incomplete_call_which_stays_in_the_text():
    assert scan_calls("x @a; @b", "@", _call_at, " \n") == ("x  @b", [("a", "{}")], 6)


def test_skip_space_stops_at_text_or_end():
    assert skip_space(" \n\tx", 0) == 3
    assert skip_space("  ", 1) == 2
