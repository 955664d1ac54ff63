"""Tests split into a sandbox input and a parent-kept expected value, the parent's verdicts, and
the strict reading of what a sandbox writes back (pure functions, no sandbox)."""
from __future__ import annotations

import json
import math

import pytest

from streamrft.schemas import Task
from streamrft.stream_ops.rewards import check_tasks
from streamrft.stream_ops.sandbox import Case, Limits, TestFormatError, parse_case
from streamrft.stream_ops.sandbox.cases import judge
from streamrft.stream_ops.sandbox.runner import ValueFormatError, decode_value, read_lines


@pytest.mark.parametrize("test, case", [
    ("assert add(1, 2) == 3", Case("eq", "add(1, 2)", expected=3)),
    ("assert 3 == add(1, 2)", Case("eq", "add(1, 2)", expected=3)),
    ("assert f([1, 2], k=-1) != (1, 'a')", Case("ne", "f([1, 2], k=-1)", expected=(1, "a"))),
    ("assert Solution().two_sum([2, 7], 9) == [0, 1]", Case("eq", "Solution().two_sum([2, 7], 9)", expected=[0, 1])),
    ("assert f(g(2)) == {1: 'x'}", Case("eq", "f(g(2))", expected={1: "x"})),
    ("assert is_prime(7)", Case("truthy", "is_prime(7)")),
    ("assert not is_prime(8)", Case("falsy", "is_prime(8)")),
    ("assert f(0) is None", Case("is", "f(0)", expected=None)),
    ("assert f(0) is not False", Case("is_not", "f(0)", expected=False)),
    ("assert f(2) in [[1, 2], [2, 1]]", Case("in", "f(2)", expected=[[1, 2], [2, 1]])),
    ("assert math.isclose(area(1), 3.14159, rel_tol=1e-3)", Case("close", "area(1)", expected=3.14159, rel_tol=1e-3)),
    ("assert abs(area(1) - 3.14) <= 0.01", Case("close", "area(1)", expected=3.14, rel_tol=0.0, abs_tol=0.01)),
    ("assert add(1, 2) == 3, 'message'", Case("eq", "add(1, 2)", expected=3)),
    ({"call": "f(1, [2])", "expected": [3, 4]}, Case("eq", "f(1, [2])", expected=[3, 4], json_equal=True)),
    ({"stdin": "1 2\n", "stdout": "3\n"}, Case("stdout", stdin="1 2\n", expected="3\n")),
])
def test_tests_are_split_into_a_call_and_an_expected_value(test, case):
    got = parse_case(test)
    assert got == case
    assert "expected" not in got.wire() and set(got.wire()) <= {"call", "stdin"}  # what the sandbox gets


@pytest.mark.parametrize("test, why", [
    ("x = f(1)\nassert x == 2", "one `assert` statement"),
    ("assert f(1) == g(2)", "is not a literal"),                   # the expected side must be a literal
    ("assert check(f(3), expected)", "cannot be split"),  # a name could carry the expected value in
    ("assert f(1) > 2", "comparison `Gt`"),
    ("assert f(1) - 0.5 == 0", "is not a call with literal arguments"),  # __sub__ could forge the zero
    ("assert f(1) == 2 or f(1) == 3", "cannot be split"),
    ("assert f(1) is 3", "None, True or False"),
    ("assert f(*args) == 1", "not a call with literal arguments"),
    ("assert (lambda: 1)() == 1", "not a call with literal arguments"),
    ("assert f(1) ==", "not valid Python"),
    ({"call": "f(1)"}, "call+expected or stdin+stdout"),
    ({"call": "__import__('os').system('x') or f", "expected": 1}, "must be a call with literal"),
    (3, "a string or an object"),
])
def test_a_test_that_cannot_be_split_is_refused_with_the_reason(test, why):
    with pytest.raises(TestFormatError, match="test 4") as e:
        parse_case(test, 4)
    assert why in str(e.value)


@pytest.mark.parametrize("case, value, ok", [
    (Case("eq", "f()", expected=3), 3, True),
    (Case("eq", "f()", expected=3), 3.0, True),             # Python's == : 3 == 3.0, as the assert would
    (Case("eq", "f()", expected=(1, 2)), [1, 2], False),    # and (1, 2) != [1, 2]
    (Case("eq", "f()", expected=[1, 2], json_equal=True), (1, 2), True),  # JSON has no tuples
    (Case("eq", "f()", expected=math.nan), math.nan, False),
    (Case("ne", "f()", expected=0), 1, True),
    (Case("is", "f()", expected=None), None, True),
    (Case("is", "f()", expected=True), 1, False),
    (Case("is_not", "f()", expected=None), 0, True),
    (Case("truthy", "f()"), [0], True),
    (Case("truthy", "f()"), "", False),
    (Case("falsy", "f()"), 0, True),
    (Case("in", "f()", expected=[[1, 2], [2, 1]]), [2, 1], True),
    (Case("in", "f()", expected="abc"), "bc", True),
    (Case("in", "f()", expected="abc"), 1, False),           # no TypeError: a different type is not in a string
    (Case("not_in", "f()", expected={1, 2}), [1], False),    # unhashable: refused, not crashed
    (Case("close", "f()", expected=3.14159, rel_tol=1e-3), 3.1428, True),   # |d| = 0.00121 <= 0.00314
    (Case("close", "f()", expected=3.14159, rel_tol=1e-3), 3.1384, False),  # |d| = 0.00319 > 0.00314
    (Case("close", "f()", expected=1.0), True, False),       # a bool is not a number here
    (Case("close", "f()", expected=1.0), "1.0", False),
    (Case("stdout", expected="3\n4\n"), "3  \n4\n\n\n", True),  # trailing blanks and blank tail lines
    (Case("stdout", expected="3\n4\n"), "3\n 4\n", False),      # leading blanks count
])
def test_the_parents_verdict(case, value, ok):
    assert judge(case, value)[0] is ok


def test_abs_tolerance_strict_and_inclusive():
    strict, inclusive = parse_case("assert abs(f() - 1.0) < 0.5"), parse_case("assert abs(f() - 1.0) <= 0.5")
    assert judge(strict, 1.5)[0] is False and judge(inclusive, 1.5)[0] is True
    assert judge(strict, 1.4999)[0] is True


def test_values_come_back_only_as_plain_values():
    tagged = ["d", [[["s", "a"], ["l", [["i", "1"], ["f", "nan"], ["t", [["b", True], ["n"]]]]]],
                    [["z", [["i", "2"]]], ["y", "ff00"]]]]
    value = decode_value(tagged)
    assert value["a"][0] == 1 and math.isnan(value["a"][1]) and value["a"][2] == (True, None)
    assert value[frozenset({2})] == b"\xff\x00"
    for bad in [["x", 1], ["i", 5], ["l", "abc"], ["e", [["l", []]]], ["d", [[["l", []], ["n"]]]],
                ["i", "9" * 5000], ["b", "yes"], "3", ["n", 1]]:
        with pytest.raises(ValueFormatError):
            decode_value(bad)
    deep = ["n"]
    for _ in range(100):
        deep = ["l", [deep]]
    with pytest.raises(ValueFormatError, match="too deep"):
        decode_value(deep)


def test_only_the_first_line_proves_the_setup_and_the_first_answer_counts():
    nonce = "ab" * 16
    lines = [{"ready": nonce}, {"i": 0, "v": ["i", "3"]}, {"i": 0, "v": ["i", "4"]}, {"i": 7, "v": ["n"]},
             {"i": "1", "v": ["n"]}, {"ready": nonce}, {"i": 1, "error": "boom"}]
    data = b"\n".join(json.dumps(x).encode() for x in lines) + b"\nnot json\n"
    ready, got = read_lines(data, nonce, total=2)
    assert ready and got == {0: {"i": 0, "v": ["i", "3"]}, 1: {"i": 1, "error": "boom"}}
    assert read_lines(data[data.index(b"\n") + 1:], nonce, 2) == (False, {})  # no handshake first: not set up
    assert read_lines(b"", nonce, 2) == (False, {})


def test_limits_name_the_field_and_range():
    with pytest.raises(ValueError, match=r"memory_mb=0 must be a number in \[32, 65536\]"):
        Limits(memory_mb=0)
    with pytest.raises(ValueError, match=r"isolate='process' must be one of \['solution', 'test'\]"):
        Limits(isolate="process")


def test_tasks_whose_tests_cannot_be_split_are_refused_at_load_time():
    from streamrft.config.stream_ops import RewardTerm

    good = Task(task_id="t1", prompt="p", answer="assert add(1, 2) == 3")
    bad = Task(task_id="t2", prompt="p", answer=None, metadata={"tests": ["assert add(1, 2) > 2"]})
    terms = [RewardTerm(name="exact_match"), RewardTerm(name="code_tests", params={"wall_s": 5})]
    check_tasks(terms, [good])
    with pytest.raises(ValueError, match=r"task t2: reward code_tests: test 0 .*comparison `Gt`"):
        check_tasks(terms, [good, bad])
    with pytest.raises(ValueError, match=r"unknown params \['wal_s'\]"):
        check_tasks([RewardTerm(name="code_tests", params={"wal_s": 5})], [good])


def run_bpf(prog: bytes, arch: int, nr: int) -> int:
    """A classic-BPF interpreter for the few instructions the filter uses, over seccomp_data."""
    import struct

    data = struct.pack("<iI", nr, arch) + bytes(56)
    insns = [struct.unpack("<HBBI", prog[i:i + 8]) for i in range(0, len(prog), 8)]
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:
            acc = struct.unpack("<I", data[k:k + 4])[0]
            pc += 1
        elif code in (0x15, 0x35):
            hit = acc == k if code == 0x15 else acc >= k
            pc += 1 + (jt if hit else jf)
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")


def test_the_seccomp_filter_denies_its_list_and_allows_the_rest():
    from streamrft.stream_ops.sandbox import seccomp

    if seccomp.platform.machine() != "x86_64":
        pytest.skip("the filter is defined for x86_64 only")
    prog = seccomp.program()
    eperm, allow, kill = 0x00050000 | 1, 0x7FFF0000, 0x80000000
    x86 = seccomp.AUDIT_ARCH_X86_64
    for name, nr in seccomp.DENIED_X86_64.items():
        assert run_bpf(prog, x86, nr) == eperm, name
    for nr in (0, 1, 2, 3, 9, 39, 56, 57, 59, 60, 231, 435):  # read, write, open, close, mmap, getpid, clone, fork, execve, exit, exit_group, clone3
        assert run_bpf(prog, x86, nr) == allow, nr
    assert run_bpf(prog, x86, 0x40000000 + 1) == eperm  # the x32 ABI
    assert run_bpf(prog, 0x40000003, 1) == kill  # i386
