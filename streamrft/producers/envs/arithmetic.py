"""A tiny, bounded arithmetic evaluator for tool calls: `+ - * /`, parentheses, unary signs.

No eval or exec: a recursive-descent parser over a whitelist of characters, computing with exact
fractions. Every input is bounded (length, digits per number, nesting depth, size of every
intermediate value), so no expression a model writes can take more than microseconds or blow
up memory; anything outside the grammar or the bounds raises `ExpressionError` saying why.
"""
from __future__ import annotations

from contextlib import contextmanager
from fractions import Fraction

MAX_CHARS = 100
"""Longest expression accepted."""
MAX_DIGITS = 12
"""Digits in one number literal."""
MAX_DEPTH = 16
"""Nested parentheses and unary signs."""
MAX_VALUE = 10**12
"""Bound on |numerator| and on the denominator of every intermediate value."""
CHARACTERS = frozenset("0123456789+-*/(). ")


class ExpressionError(ValueError):
    """The expression is outside the grammar or the bounds; the message says why."""


class _Parser:
    """expr := term (('+' | '-') term)*;  term := unary (('*' | '/') unary)*;
    unary := ('+' | '-') unary | atom;  atom := number | '(' expr ')';  number := digits ['.' digits]"""

    def __init__(self, text: str):
        self.text = text
        self.pos = 0
        self.depth = 0

    def parse(self) -> Fraction:
        value = self._expr()
        if self._peek():
            raise ExpressionError(f"unexpected {self.text[self.pos]!r} at {self.pos}")
        return value

    def _peek(self) -> str:
        """The next character that is not a space ("" at the end)."""
        while self.pos < len(self.text) and self.text[self.pos] == " ":
            self.pos += 1
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def _take(self) -> str:
        self.pos += 1
        return self.text[self.pos - 1]

    @contextmanager
    def _nested(self):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ExpressionError(f"nested deeper than {MAX_DEPTH}")
        yield
        self.depth -= 1

    def _expr(self) -> Fraction:
        value = self._term()
        while self._peek() in ("+", "-"):
            op = self._take()
            rhs = self._term()
            value = _bounded(value + rhs if op == "+" else value - rhs)
        return value

    def _term(self) -> Fraction:
        value = self._unary()
        while self._peek() in ("*", "/"):
            op = self._take()
            rhs = self._unary()
            if op == "/" and rhs == 0:
                raise ExpressionError("division by zero")
            value = _bounded(value * rhs if op == "*" else value / rhs)
        return value

    def _unary(self) -> Fraction:
        if self._peek() in ("+", "-"):
            sign = self._take()
            with self._nested():
                value = self._unary()
            return -value if sign == "-" else value
        return self._atom()

    def _atom(self) -> Fraction:
        if self._peek() != "(":
            return self._number()
        self._take()
        with self._nested():
            value = self._expr()
        if self._peek() != ")":
            raise ExpressionError(f"missing ')' at {self.pos}")
        self._take()
        return value

    def _number(self) -> Fraction:
        self._peek()
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in "0123456789.":  # no spaces inside a number
            self.pos += 1
        literal = self.text[start:self.pos]
        if not literal:
            raise ExpressionError(f"expected a number at {start}" if self._peek() else "unexpected end")
        whole, dot, frac = literal.partition(".")
        if not whole or (dot and not frac) or "." in frac:
            raise ExpressionError(f"bad number {literal!r}")
        if len(whole) + len(frac) > MAX_DIGITS:
            raise ExpressionError(f"number {literal!r} has more than {MAX_DIGITS} digits")
        return Fraction(literal)


def _bounded(value: Fraction) -> Fraction:
    if abs(value.numerator) > MAX_VALUE or value.denominator > MAX_VALUE:
        raise ExpressionError(f"a value exceeds {MAX_VALUE:.0e}")
    return value


def evaluate(expression: str) -> Fraction:
    """The exact value of `expression` ("17*23", "-(1+2)/4", "0.5*3"); raises `ExpressionError`."""
    if len(expression) > MAX_CHARS:
        raise ExpressionError(f"longer than {MAX_CHARS} characters")
    bad = set(expression) - CHARACTERS
    if bad:
        raise ExpressionError(f"characters {''.join(sorted(bad))!r} are not arithmetic")
    return _Parser(expression).parse()


def render(value: Fraction, places: int = 6) -> str:
    """`391`, `-0.25`, `0.333333`: an integer as such, else a decimal rounded (half to even) to `places`."""
    scaled = round(value * 10**places)
    whole, frac = divmod(abs(scaled), 10**places)
    text = f"{whole}.{frac:0{places}d}".rstrip("0").rstrip(".")
    return f"-{text}" if scaled < 0 else text
