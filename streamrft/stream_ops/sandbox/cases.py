"""Tests split into what runs in the sandbox and what the parent keeps.

A test is turned, when it is loaded, into a `Case`: an input the sandbox runs (a call expression
evaluated after the solution, or a program's stdin) and a check the parent applies to what comes
back. The expected value never enters the sandbox, so no code in there can read it, and the
comparison is made outside, on plain values only (`runner.decode_value`).

Accepted forms (anything else is refused with a `TestFormatError` naming the test):

    assert CALL == LITERAL            (or LITERAL == CALL)      -> eq
    assert CALL != LITERAL                                      -> ne
    assert CALL is None / True / False (is not ...)             -> is / is_not
    assert CALL  /  assert not CALL                             -> truthy / falsy
    assert CALL in LITERAL  /  not in                           -> in / not_in
    assert math.isclose(CALL, LITERAL[, rel_tol=L, abs_tol=L])  -> close
    assert abs(CALL - LITERAL) < LITERAL  (or <=)               -> close (abs_tol)
    {"call": "f(1, 2)", "expected": 3}                          -> eq (JSON: lists match tuples)
    {"stdin": "1 2\\n", "stdout": "3\\n"}                        -> the solution run as a program

CALL is a call (`f(1)`, `Solution().two_sum([2, 7], 9)`, `f(g(2))`) whose arguments are literals
or calls again: an argument that is not a literal could carry the expected value into the sandbox
(`assert check(f(3), 6)`), and a predicate around the call would be the solution's to replace
(`assert math.isclose(...)` in the sandbox is one `math.isclose = lambda *a, **k: True` away), so
those are split, or refused.
"""
from __future__ import annotations

import ast
import json
import math
from dataclasses import dataclass, field
from typing import Any


class TestFormatError(ValueError):
    """A test that cannot be split into an input and an expected value."""
    __test__ = False  # not a pytest class


CHECKS = ("eq", "ne", "is", "is_not", "truthy", "falsy", "in", "not_in", "close", "stdout")


@dataclass(frozen=True)
class Case:
    check: str
    """One of CHECKS."""
    call: str | None = None
    """The expression the sandbox evaluates (None for a stdin/stdout case)."""
    stdin: str | None = None
    """The program's standard input (a stdin/stdout case)."""
    expected: Any = None
    json_equal: bool = False
    """Compare as JSON values (tuples equal lists): the expected value came from JSON."""
    rel_tol: float = 1e-9
    abs_tol: float = 0.0
    source: str = field(default="", compare=False)

    def wire(self) -> dict:
        """What the sandbox gets of this case: its input, never its expected value."""
        return {"call": self.call} if self.call is not None else {"stdin": self.stdin}


def parse_case(test: str | dict, index: int = 0) -> Case:
    """One test, as a string (`assert ...`) or a dict (`{"call", "expected"}` / `{"stdin", "stdout"}`)."""
    if isinstance(test, dict):
        return _dict_case(test, index)
    if not isinstance(test, str):
        raise TestFormatError(f"test {index}: a test is a string or an object, not {type(test).__name__}")
    source = test.strip()
    try:
        tree = ast.parse(source, mode="exec")
    except (SyntaxError, ValueError) as e:  # ValueError: a NUL byte, a lone surrogate
        raise TestFormatError(f"test {index} {source[:80]!r}: not valid Python ({getattr(e, 'msg', e)})") from None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        raise TestFormatError(f"test {index} {source[:80]!r}: a test is one `assert` statement "
                              f"(or {{\"call\": ..., \"expected\": ...}} / {{\"stdin\": ..., \"stdout\": ...}})")
    return _assert_case(tree.body[0].test, source, index)


def parse_cases(tests: list) -> list[Case]:
    return [parse_case(t, i) for i, t in enumerate(tests)]


def _refuse(source: str, index: int, why: str) -> TestFormatError:
    return TestFormatError(
        f"test {index} {source[:80]!r}: {why}; write it as `assert call(literal args) == literal` "
        f"(or !=, is None/True/False, in, truthy, math.isclose(call, literal)), "
        f"or as {{\"call\": ..., \"expected\": ...}}")


def _literal(node: ast.AST, source: str, index: int, what: str) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise _refuse(source, index, f"the {what} `{ast.unparse(node)[:60]}` is not a literal") from None


def _is_call(node: ast.AST) -> bool:
    """A call chain whose every argument is a literal or such a call: `f(1)`, `S().f([1], k=2)`."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    while isinstance(func, (ast.Attribute, ast.Subscript, ast.Call)):
        if isinstance(func, ast.Call):
            if not _is_call(func):
                return False
            break
        if isinstance(func, ast.Subscript) and not _is_literal(func.slice):
            return False
        func = func.value
    else:
        if not isinstance(func, ast.Name):
            return False
    return all(_is_literal(a) or _is_call(a) for a in [*node.args, *(k.value for k in node.keywords)]) \
        and not any(isinstance(a, ast.Starred) for a in node.args) and all(k.arg for k in node.keywords)


def _is_literal(node: ast.AST) -> bool:
    try:
        ast.literal_eval(node)
        return True
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


def _assert_case(node: ast.AST, source: str, index: int) -> Case:
    def call_of(n: ast.AST) -> str:
        if not _is_call(n):
            raise _refuse(source, index, f"`{ast.unparse(n)[:60]}` is not a call with literal arguments")
        return ast.unparse(n)

    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return Case("falsy", call_of(node.operand), source=source)
    if isinstance(node, ast.Call) and _dotted(node.func) in ("math.isclose", "isclose"):
        if len(node.args) != 2:
            raise _refuse(source, index, "math.isclose takes the call and the expected value")
        a, b = node.args
        call, expected = (a, b) if _is_call(a) else (b, a)
        tols = {k.arg: float(_literal(k.value, source, index, k.arg or "tolerance")) for k in node.keywords}
        if set(tols) - {"rel_tol", "abs_tol"}:
            raise _refuse(source, index, f"math.isclose takes rel_tol and abs_tol, not {sorted(set(tols) - {'rel_tol', 'abs_tol'})}")
        return Case("close", call_of(call), expected=_number(_literal(expected, source, index, "expected value"), source, index),
                    rel_tol=tols.get("rel_tol", 1e-9), abs_tol=tols.get("abs_tol", 0.0), source=source)
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        left, op, right = node.left, node.ops[0], node.comparators[0]
        if isinstance(op, (ast.Lt, ast.LtE)) and isinstance(left, ast.Call) and _dotted(left.func) == "abs" \
                and len(left.args) == 1 and isinstance(left.args[0], ast.BinOp) and isinstance(left.args[0].op, ast.Sub):
            diff = left.args[0]
            call, expected = (diff.left, diff.right) if _is_call(diff.left) else (diff.right, diff.left)
            tol = float(_literal(right, source, index, "tolerance"))
            return Case("close", call_of(call), expected=_number(_literal(expected, source, index, "expected value"), source, index),
                        rel_tol=0.0, abs_tol=tol if isinstance(op, ast.LtE) else math.nextafter(tol, 0.0), source=source)
        if isinstance(op, (ast.Eq, ast.NotEq)):
            call, expected = (left, right) if _is_call(left) else (right, left)
            return Case("eq" if isinstance(op, ast.Eq) else "ne", call_of(call),
                        expected=_literal(expected, source, index, "expected value"), source=source)
        if isinstance(op, (ast.Is, ast.IsNot)):
            value = _literal(right, source, index, "expected value")
            if value is not None and value is not True and value is not False:
                raise _refuse(source, index, "`is` compares with None, True or False only")
            return Case("is" if isinstance(op, ast.Is) else "is_not", call_of(left), expected=value, source=source)
        if isinstance(op, (ast.In, ast.NotIn)):
            container = _literal(right, source, index, "container")
            if not isinstance(container, (list, tuple, set, frozenset, dict, str, bytes)):
                raise _refuse(source, index, "`in` needs a literal list, tuple, set, dict or string")
            return Case("in" if isinstance(op, ast.In) else "not_in", call_of(left), expected=container, source=source)
        raise _refuse(source, index, f"the comparison `{type(op).__name__}` is not one the parent can check")
    if _is_call(node):
        return Case("truthy", ast.unparse(node), source=source)
    raise _refuse(source, index, "it cannot be split into a call and an expected value")


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _number(value: Any, source: str, index: int) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _refuse(source, index, "a tolerance check needs a number as its expected value")
    return value


def _dict_case(test: dict, index: int) -> Case:
    keys = set(test)
    source = json.dumps(test)[:200]
    if keys == {"call", "expected"}:
        call = test["call"]
        try:
            node = ast.parse(call, mode="eval").body if isinstance(call, str) else None
        except (SyntaxError, ValueError):
            node = None
        if node is None or not _is_call(node):
            raise _refuse(source, index, "\"call\" must be a call with literal arguments, e.g. \"f(1, [2])\"")
        return Case("eq", ast.unparse(node), expected=test["expected"], json_equal=True, source=source)
    if keys == {"stdin", "stdout"}:
        if not isinstance(test["stdin"], str) or not isinstance(test["stdout"], str):
            raise TestFormatError(f"test {index}: \"stdin\" and \"stdout\" must be strings")
        return Case("stdout", stdin=test["stdin"], expected=test["stdout"], source=source)
    raise TestFormatError(f"test {index} {source[:80]}: an object test has the keys call+expected or "
                          f"stdin+stdout, not {sorted(keys)}")


# ---- the parent's verdict -------------------------------------------------------------------

def judge(case: Case, value: Any) -> tuple[bool, str]:
    """Whether `value` (what the sandbox returned for `case`, a plain value) passes; else why not."""
    check, expected = case.check, case.expected
    try:
        if check == "stdout":
            ok = _lines(value) == _lines(expected)
        elif check == "eq":
            ok = _json_form(value) == _json_form(expected) if case.json_equal else _same(value, expected)
        elif check == "ne":
            ok = not _same(value, expected)
        elif check == "is":
            ok = value is expected
        elif check == "is_not":
            ok = value is not expected
        elif check == "truthy":
            ok = bool(value)
        elif check == "falsy":
            ok = not value
        elif check == "in":
            ok = _contains(expected, value)
        elif check == "not_in":
            ok = not _contains(expected, value)
        elif check == "close":
            ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
                  and math.isclose(value, expected, rel_tol=case.rel_tol, abs_tol=case.abs_tol))
        else:
            raise AssertionError(f"unknown check {check!r}")
    except (TypeError, ValueError, OverflowError, RecursionError) as e:  # unhashable in a set, ...
        return False, f"{type(e).__name__}: {e}"
    if ok:
        return True, ""
    shown = repr(value)
    return False, f"AssertionError: {case.call or 'the program'} gave {shown[:200]}{'...' if len(shown) > 200 else ''}"


def _same(a: Any, b: Any) -> bool:
    return a == b  # both are plain values (decode_value): == is the builtin one


def _contains(container: Any, value: Any) -> bool:
    if isinstance(container, (str, bytes)):
        return isinstance(value, type(container)) and value in container
    return value in container


def _json_form(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return [_json_form(x) for x in v]
    if isinstance(v, dict):
        return {str(k) if not isinstance(k, str) else k: _json_form(x) for k, x in v.items()}
    return v


def _lines(text: Any) -> list[str] | None:
    """A program's output as graders compare it: lines with trailing blanks and blank tail lines dropped."""
    if not isinstance(text, str):
        return None
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines
