"""Showing stored text on a terminal without letting it act on the terminal.

Rows written before the identifier grammar (catalog.definition.identifiers) still exist,
and a row can be edited by hand: a model named ``x\\ny`` would print as two
lines and forge a row of ``llmgw history``, an ANSI escape would recolour or
clear the screen, and a U+202E RIGHT-TO-LEFT OVERRIDE would make a name read
backwards. Every value the command line prints goes through ``shown``.
"""

from __future__ import annotations

from catalog.forms.printable import printable


def shown(value: object) -> str:
    """``value`` as text that prints as exactly what it is, on one line.

    Text whose every character is printable (``catalog.forms.printable``, the rule
    the identifier grammar checks: no control, format, bidi, zero-width, line
    or paragraph separator, private-use or unassigned characters; the ASCII
    space is printable) is returned as it is, so ordinary names and reasons
    read unchanged. Anything else is shown as a Python string literal, quotes
    included (``'x\\ny'``, ``'\\u202eabc'``):
    the quotes say at a glance that the value holds characters that cannot be
    printed, and the literal says exactly which.
    """
    text = value if isinstance(value, str) else str(value)
    if printable(text):
        return text
    return repr(text)


def guard_line(text: str) -> str:
    """Escape every unprintable character of already formatted output but its newlines.

    A net under ``shown`` for output written as a whole (``print``): whatever a
    formatter forgot to pass through ``shown`` still cannot reach the terminal
    as a control sequence. It cannot tell a forged newline from a real one;
    that is what ``shown`` on each value is for.
    """
    if printable(text):
        return text
    return "".join(ch if printable(ch) or ch == "\n" else repr(ch)[1:-1] for ch in text)
