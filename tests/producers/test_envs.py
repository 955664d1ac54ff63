"""The environments' rules, played by hand, the safe arithmetic parser, and the registry."""
from __future__ import annotations

from fractions import Fraction

import pytest

from streamrft.producers.envs import ENVIRONMENTS, Environment, env_factory
from tests_helpers import Countdown
from streamrft.producers.envs import calculator, guess_number
from streamrft.producers.envs.arithmetic import MAX_CHARS, ExpressionError, evaluate, render
from streamrft.producers.envs.calculator import Calculator, find_call
from streamrft.producers.envs.guess_number import GuessNumber
from streamrft.schemas import Task


def _task(answer: str, prompt: str = "p") -> Task:
    return Task(task_id="t", prompt=prompt, answer=answer)


# ---- guess_number ----

def test_guess_number_binary_search_wins_with_the_turn_penalty():
    env = GuessNumber()  # 1-8, 4 guesses, penalty 0.05
    assert env.reset(_task("5", "guess 1-8:")) == "guess 1-8:"
    assert env.step("4") == ("higher:", 0.0, False, {"guesses": 1})
    assert env.step(" 6 ") == ("lower:", 0.0, False, {"guesses": 2})
    obs, reward, done, info = env.step("5")
    assert (obs, done, info) == ("correct", True, {"guesses": 3, "outcome": "won"})
    assert reward == pytest.approx(0.9)


def test_guess_number_first_guess_scores_one_and_invalid_guesses_cost_a_turn():
    env = GuessNumber()
    env.reset(_task("3"))
    assert env.step("3")[1:3] == (1.0, True)
    env.reset(_task("3"))  # a reset starts over
    assert env.step("three") == ("invalid:", 0.0, False, {"guesses": 1})
    assert env.step("3.0")[0] == "invalid:"
    assert env.step("12")[0] == "lower:"  # outside the range: still the right direction
    obs, reward, done, info = env.step("3")
    assert done and info["guesses"] == 4 and reward == pytest.approx(1 - 3 * 0.05)


def test_guess_number_ends_lost_after_max_guesses():
    env = GuessNumber(low=1, high=8, max_guesses=2)
    env.reset(_task("8"))
    assert env.step("1")[:3] == ("higher:", 0.0, False)
    assert env.step("2") == ("lost", 0.0, True, {"guesses": 2, "outcome": "lost"})


def test_guess_number_reward_never_below_zero_and_params_are_checked():
    env = GuessNumber(low=0, high=100, max_guesses=50, turn_penalty=0.5)
    env.reset(_task("0"))
    for g in ("1", "2", "3"):
        env.step(g)
    assert env.step("0")[1:3] == (0.0, True)
    with pytest.raises(ValueError, match="low <= high"):
        GuessNumber(low=5, high=1)
    with pytest.raises(ValueError):
        GuessNumber(max_guesses=0)


@pytest.mark.parametrize("answer,match", [("x", "not an integer"), (None, "not an integer"), ("9", "outside")])
def test_guess_number_rejects_a_bad_secret(answer, match):
    with pytest.raises(ValueError, match=match):
        GuessNumber().reset(Task(task_id="t", prompt="p", answer=answer))


def test_guess_number_step_before_reset():
    with pytest.raises(RuntimeError):
        GuessNumber().step("1")


def test_guess_number_tasks_are_deterministic_and_written_in_the_alphabet():
    rows = guess_number.make_tasks(50, seed=3, low=2, high=9)
    assert rows == guess_number.make_tasks(50, seed=3, low=2, high=9)
    assert {int(r["answer"]) for r in rows} <= set(range(2, 10)) and len({r["answer"] for r in rows}) > 3
    texts = [r["prompt"] for r in rows] + [guess_number.HIGHER, guess_number.LOWER, guess_number.INVALID,
                                           guess_number.CORRECT, guess_number.LOST, "-12345"]
    assert set("".join(texts)) <= set(guess_number.ALPHABET)


# ---- arithmetic ----

@pytest.mark.parametrize("expression,value", [
    ("17*23", 391), ("1 + 2 * 3", 7), ("(1+2)*3", 9), ("-(1+2)/4", Fraction(-3, 4)), ("0.5*3", Fraction(3, 2)),
    ("--2", 2), ("+2", 2), ("10/4", Fraction(5, 2)), ("8-2-1", 5), ("8/2/2", 2), ("((7))", 7),
])
def test_arithmetic_values_and_precedence(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize("expression,match", [
    ("", "unexpected end"), ("1+", "unexpected end"), ("2**3", "expected a number"), ("1 2", "unexpected '2'"),
    ("(1", "missing '\\)'"), ("1)", "unexpected '\\)'"), ("1/0", "division by zero"), ("1/(2-2)", "division by zero"),
    (".5", "bad number"), ("5.", "bad number"), ("1.2.3", "bad number"), ("__import__('os')", "not arithmetic"),
    ("1e5", "not arithmetic"), ("1234567890123", "more than 12 digits"),
    ("999999999999*999999999999", "exceeds"), ("1/9999999/9999999", "exceeds"),
    ("(" * 17 + "1" + ")" * 17, "nested deeper"), ("-" * 17 + "1", "nested deeper"),
    ("1+" * 50 + "1", f"longer than {MAX_CHARS}"),
])
def test_arithmetic_refuses_what_is_outside_the_grammar_or_the_bounds(expression, match):
    with pytest.raises(ExpressionError, match=match):
        evaluate(expression)


def test_arithmetic_bounds_allow_the_edge():
    assert evaluate("(" * 16 + "1" + ")" * 16) == 1
    assert evaluate("999999999999+1") == 10**12


@pytest.mark.parametrize("value,text", [
    (Fraction(391), "391"), (Fraction(-3, 4), "-0.75"), (Fraction(1, 3), "0.333333"), (Fraction(2, 3), "0.666667"),
    (Fraction(-1, 10**7), "0"), (Fraction(5, 2), "2.5"), (Fraction(0), "0"),
])
def test_render(value, text):
    assert render(value) == text


# ---- calculator ----

def test_calculator_call_then_right_answer():
    env = Calculator()
    assert env.reset(_task("391", "17*23?")) == "17*23?"
    assert env.step("calc(17*23)") == ("=391\n", 0.0, False, {"calls": 1})
    assert env.step(" 391 ") == ("right", 1.0, True, {"calls": 1, "outcome": "right"})


def test_calculator_answer_without_a_call_and_wrong_answers():
    env = Calculator()
    env.reset(_task("391"))
    assert env.step("391.0")[1:3] == (1.0, True)  # the same number
    env.reset(_task("391"))
    assert env.step("390") == ("wrong", 0.0, True, {"calls": 0, "outcome": "wrong"})
    env.reset(_task("-0.5"))
    assert env.step("the answer is -0.5")[1:3] == (0.0, True)  # the whole turn must be the number


def test_calculator_errors_text_around_the_call_and_too_many_calls():
    env = Calculator(max_calls=2)
    env.reset(_task("7"))
    obs, reward, done, info = env.step("calc(1/0)")
    assert (obs, reward, done) == ("=error\n", 0.0, False) and "division by zero" in info["error"]
    assert env.step("let me see calc((1+2)*2+1) ok calc(9)")[:3] == ("=7\n", 0.0, False)  # the first call only
    assert env.step("calc(7)") == ("no calls left", 0.0, True, {"calls": 3, "outcome": "too_many_calls"})


def test_calculator_refuses_a_bad_answer_in_the_task():
    with pytest.raises(ValueError, match="not a number"):
        Calculator().reset(_task("seven"))


@pytest.mark.parametrize("text,arg", [
    ("calc(1+2)", "1+2"), ("x calc((1+2)*3) y", "(1+2)*3"), ("calc(1+2", ""), ("calc()", ""),
    ("391", None), ("calc (1)", None),
])
def test_find_call(text, arg):
    assert find_call(text) == arg


def test_calculator_tasks_answers_are_right_and_in_the_alphabet():
    rows = calculator.make_tasks(40, seed=1, ops="+-*/")
    assert rows == calculator.make_tasks(40, seed=1, ops="+-*/")
    for row in rows:
        env = Calculator()
        env.reset(Task(**row))
        obs = env.step(f"calc({row['prompt'][:-1]})")[0]
        assert env.step(obs.strip("=\n"))[1] == 1.0
    texts = [r["prompt"] + r["answer"] for r in rows] + ["calc(-(1.5))", calculator.result_text(calculator.ERROR),
                                                         calculator.RIGHT, calculator.WRONG, calculator.NO_CALLS]
    assert set("".join(texts)) <= set(calculator.ALPHABET)


# ---- the registry and a user's own environment ----

def test_registry_names_build_fresh_environments_with_params():
    assert set(ENVIRONMENTS) == {"guess_number", "calculator"}
    make = env_factory("guess_number", params={"high": 20, "max_guesses": 6})
    a, b = make(), make()
    assert a is not b and isinstance(a, GuessNumber) and (a.high, a.max_guesses) == (20, 6)
    assert all(isinstance(cls(), Environment) for cls in ENVIRONMENTS.values())


def test_a_users_environment_by_import_path():
    make = env_factory("guess_number", import_path="tests_helpers:Countdown", params={"start": 2})
    env = make()
    assert isinstance(env, Countdown) and isinstance(env, Environment)
    assert env.reset(_task("")) == "p"
    assert env.step("2") == (" next:", 0.0, False, {}) and env.step("1") == ("done", 1.0, True, {})


def test_registry_errors_name_the_problem():
    with pytest.raises(ValueError, match="'nope'.*calculator, guess_number"):
        env_factory("nope")
    with pytest.raises(ValueError, match="pkg.module:function"):
        env_factory(None, import_path="no_colon")
    with pytest.raises(TypeError):
        env_factory("calculator", params={"bogus": 1})()
