"""Multi-turn workflows: masks on hand-built token lists, limits, chat templates, batching, the wire.

A scripted engine stands in where a test must force the model's tokens; the real transformers
engine on a tiny char model plays whole episodes end to end, and its recorded log-probs are
checked against a teacher-forced forward pass over the concatenated ids.
"""
from __future__ import annotations

import math
import re

import pytest

torch = pytest.importorskip("torch")

from streamrft.config import ExplorerConfig  # noqa: E402
from streamrft.engine.models import build_char_tokenizer, build_tiny_model  # noqa: E402
from streamrft.engine.rollout.base import Completion, SamplingParams  # noqa: E402
from streamrft.engine.rollout.hf import TransformersEngine  # noqa: E402
from streamrft.producers.envs import StepResult, calculator, env_factory, guess_number  # noqa: E402
from streamrft.producers.workflows import (WORKFLOWS, TurnLimits, make_workflow, multi_turn,  # noqa: E402
                                           single_turn, step_wise)
from streamrft.producers.workflows.demonstrations import demonstration, mixture  # noqa: E402
from streamrft.producers.envs.guess_number import GuessNumber  # noqa: E402
from streamrft.producers.workflows.turns import TurnEncoder  # noqa: E402
from streamrft.schemas import RolloutGroup, Task, decode, encode  # noqa: E402
from streamrft.stream_ops.validate import validate  # noqa: E402

ALPHABET = "".join(sorted(set(guess_number.ALPHABET + calculator.ALPHABET)))
TEAM = "agents"
# ChatML in miniature: <bos> opens a turn, <eos> closes it, then a newline
CHATML = ("{% for m in messages %}<bos>{{ m['role'][0] }}:{{ m['content'] }}<eos>\n{% endfor %}"
          "{% if add_generation_prompt %}<bos>a:{% endif %}")
LP = -0.25  # the scripted engine's log-prob of every token


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer(ALPHABET)


@pytest.fixture
def chat_tok():
    t = build_char_tokenizer(ALPHABET)
    t.chat_template = CHATML
    return t


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False).input_ids


class ScriptedEngine:
    """Answers each prompt with `policy(prompt_text)` (special tokens written out, e.g. "4<eos>"), as an
    engine would: cut at `max_new_tokens` ("length"), kept up to and including a stop token ("stop")."""

    version = 0

    def __init__(self, tokenizer, policy):
        self.tokenizer, self.policy, self.calls = tokenizer, policy, []

    def generate(self, prompt_ids, params):
        self.calls.append(([list(p) for p in prompt_ids], params))
        stops = {self.tokenizer.eos_token_id, *params.stop_token_ids}
        out = []
        for p in prompt_ids:
            answer = self.policy(self.tokenizer.decode(p, skip_special_tokens=False))
            token_ids = answer if isinstance(answer, list) else ids(self.tokenizer, answer)
            end = next((i + 1 for i, t in enumerate(token_ids) if t in stops), None)
            reason = "stop" if end is not None and end <= params.max_new_tokens else "length"
            token_ids = token_ids[:end] if reason == "stop" else token_ids[:params.max_new_tokens]
            out.append([Completion(token_ids, [LP] * len(token_ids),
                                   self.tokenizer.decode(token_ids, skip_special_tokens=True), reason)
                        for _ in range(params.n)])
        return out


def feedbacks(text: str) -> int:
    """How many guess_number feedbacks `text` holds: the index of the model's next turn."""
    return sum(text.count(word) for word in (guess_number.HIGHER, guess_number.LOWER, guess_number.INVALID))


def guesses(*turns: str):
    """A policy playing `turns` in order (the last one again once they run out)."""
    return lambda text: turns[min(feedbacks(text), len(turns) - 1)]


def check_wire(groups: list[RolloutGroup]) -> None:
    for g in groups:
        assert decode(encode(g), RolloutGroup) == g
        assert validate(encode(g), TEAM) == g
        for t in g.trajectories:
            assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.mask()) if m == 0)


def _task(answer="5", prompt="guess 1-8:", task_id="t0") -> Task:
    return Task(task_id=task_id, prompt=prompt, answer=answer)


def run(workflow, engine, tasks, n=1, max_new_tokens=8, env=None, limits=TurnLimits(), chat=False):
    groups = workflow(engine, tasks, SamplingParams(n=n, max_new_tokens=max_new_tokens), version=3, team=TEAM,
                      producer_id="test", chat=chat, env=env or env_factory("guess_number"), limits=limits)
    check_wire(groups)
    return groups


# ---- multi_turn: the concatenated trajectory ----

def test_multi_turn_masks_the_environment_and_keeps_the_models_tokens(tok):
    eng = ScriptedEngine(tok, guesses("4<eos>", "6<eos>", "5<eos>"))
    (group,) = run(multi_turn, eng, [_task("5")])
    (t,) = group.trajectories
    eos, bos = tok.eos_token_id, tok.bos_token_id
    assert t.prompt_ids == [bos] + ids(tok, "guess 1-8:")
    assert t.response_ids == (ids(tok, "4") + [eos] + ids(tok, "higher:") + ids(tok, "6") + [eos]
                              + ids(tok, "lower:") + ids(tok, "5") + [eos])
    assert t.loss_mask == [1, 1] + [0] * 7 + [1, 1] + [0] * 6 + [1, 1]
    assert t.logprobs == [LP if m else 0.0 for m in t.loss_mask]
    assert (t.finish_reason, t.model_version, t.team) == ("env_done", 3, TEAM)
    assert t.env_reward == pytest.approx(0.9)
    assert t.info["turns"] == 3 and t.info["step_rewards"] == [0.0, 0.0, pytest.approx(0.9)]
    assert t.info["env_info"] == {"guesses": 3, "outcome": "won"} and len(t.info["episode_id"]) == 32
    assert t.response_text == "4higher:6lower:5"
    # each turn's prompt is exactly the ids so far: the prompt, then the response up to that turn
    assert [c[0] for c, _ in eng.calls] == [t.prompt_ids, t.prompt_ids + t.response_ids[:9],
                                            t.prompt_ids + t.response_ids[:17]]
    assert all(p.n == 1 for _, p in eng.calls)


def test_multi_turn_never_retokenizes_the_models_tokens(tok):
    # <unk> then "4": decoding drops <unk>, so re-tokenizing the text would lose it
    weird = [tok.unk_token_id] + ids(tok, "4") + [tok.eos_token_id]
    eng = ScriptedEngine(tok, lambda text: weird if feedbacks(text) == 0 else "5<eos>")
    (t,) = run(multi_turn, eng, [_task("5")])[0].trajectories
    assert t.response_ids[:3] == weird and t.loss_mask[:3] == [1, 1, 1]
    assert eng.calls[1][0][0][-len(t.response_ids[:10]):] == t.response_ids[:10]


def test_tool_use_episode_through_the_workflow(tok):
    def policy(text):
        return "calc(17*23)<eos>" if "=" not in text else "391<eos>"

    (t,) = run(multi_turn, ScriptedEngine(tok, policy), [_task("391", "17*23?")],
               max_new_tokens=16, env=env_factory("calculator"))[0].trajectories
    model = ids(tok, "calc(17*23)") + [tok.eos_token_id]
    assert t.response_ids == model + ids(tok, "=391\n") + ids(tok, "391") + [tok.eos_token_id]
    assert t.loss_mask == [1] * len(model) + [0] * 5 + [1] * 4
    assert (t.env_reward, t.finish_reason, t.info["step_rewards"]) == (1.0, "env_done", [0.0, 1.0])


# ---- limits ----

def test_max_turns_ends_the_episode_without_the_last_observation(tok):
    env = env_factory("guess_number", params={"max_guesses": 10})
    (t,) = run(multi_turn, ScriptedEngine(tok, lambda _: "1<eos>"), [_task("8")], env=env,
               limits=TurnLimits(max_turns=2))[0].trajectories
    assert t.finish_reason == "max_turns" and t.info["turns"] == 2 and t.env_reward == 0.0
    assert t.response_ids == ids(tok, "1<eos>higher:1<eos>")
    assert t.loss_mask == [1, 1] + [0] * 7 + [1, 1]


def test_a_turn_cut_at_max_new_tokens_ends_with_length_and_never_reaches_the_environment(tok):
    (t,) = run(multi_turn, ScriptedEngine(tok, lambda _: "12345<eos>"), [_task("5")],
               max_new_tokens=3)[0].trajectories
    assert (t.finish_reason, t.response_ids, t.loss_mask) == ("length", ids(tok, "123"), [1, 1, 1])
    assert t.info["step_rewards"] == [0.0] and t.info["env_info"] == {}  # step() was never called


def test_max_total_tokens_cuts_the_turn_that_crosses_it(tok):
    # prompt 11 ids; turn 1 + "higher:" = 9 more (20); a budget of 21 leaves 1 id for turn 2
    eng = ScriptedEngine(tok, lambda _: "1<eos>")
    (t,) = run(multi_turn, eng, [_task("8")], limits=TurnLimits(max_total_tokens=21))[0].trajectories
    assert t.finish_reason == "max_total_tokens" and len(t.prompt_ids) + len(t.response_ids) == 21
    assert t.response_ids[-2:] == ids(tok, ":1") and t.loss_mask[-1] == 1
    assert eng.calls[1][1].max_new_tokens == 1
    # an observation that would leave no room for a model token is not appended
    (t,) = run(multi_turn, eng, [_task("8")], limits=TurnLimits(max_total_tokens=20))[0].trajectories
    assert t.finish_reason == "max_total_tokens" and t.response_ids == ids(tok, "1<eos>")
    # a model turn stopped by the budget, not by max_new_tokens, says so
    eng = ScriptedEngine(tok, lambda _: "12345<eos>")
    (t,) = run(multi_turn, eng, [_task("8")], limits=TurnLimits(max_total_tokens=14))[0].trajectories
    assert (t.finish_reason, t.response_ids) == ("max_total_tokens", ids(tok, "123"))


def test_episodes_of_different_budgets_share_one_call_and_are_cut_to_their_own(tok):
    eng = ScriptedEngine(tok, lambda _: "12345678<eos>")
    long_prompt = _task("5", "guess 1-8: now guess", "t1")
    (a,), (b,) = [g.trajectories for g in run(multi_turn, eng, [_task("5"), long_prompt],
                                                  limits=TurnLimits(max_total_tokens=24))]
    assert len(eng.calls) == 1 and eng.calls[0][1].max_new_tokens == 8  # the larger budget (min with 24-11=13)
    assert (a.finish_reason, len(a.response_ids)) == ("length", 8)
    assert (b.finish_reason, len(b.prompt_ids) + len(b.response_ids)) == ("max_total_tokens", 24)


def test_a_prompt_over_the_budget_ends_before_the_first_turn(tok):
    eng = ScriptedEngine(tok, lambda _: "1<eos>")
    (t,) = run(multi_turn, eng, [_task("5")], limits=TurnLimits(max_total_tokens=5))[0].trajectories
    assert (t.response_ids, t.loss_mask, t.finish_reason, t.env_reward) == ([], [], "max_total_tokens", 0.0)
    (s,) = run(step_wise, eng, [_task("5")], limits=TurnLimits(max_total_tokens=5))[0].trajectories
    assert (s.response_ids, s.info["step"], s.info["num_steps"]) == ([], 0, 1)
    assert eng.calls == []


def test_limits_are_checked():
    with pytest.raises(ValueError):
        TurnLimits(max_turns=0)
    with pytest.raises(ValueError):
        TurnLimits(max_total_tokens=1)


@pytest.mark.parametrize("workflow", [multi_turn, step_wise])
def test_an_environment_that_fails_ends_its_episode_env_error_and_is_never_trained(tok, workflow):
    """Raising in reset or step, a non-finite reward, a non-str observation, a result that is not a
    4-tuple: each ends its own episode `env_error`, is counted, and stays out of its group; the
    group goes out with the episodes that ended normally while half of them did, else it is dropped."""
    class Flaky(GuessNumber):
        made = 0

        def __init__(self):
            super().__init__()
            Flaky.made += 1
            self.mode, self.closed = BROKEN[(Flaky.made - 1) % len(BROKEN)], False
            CLOSED.append(self)

        def reset(self, task):
            if self.mode == "reset":
                raise RuntimeError("no such task")
            return super().reset(task)

        def step(self, action):
            if self.mode == "raise":
                raise ConnectionError("tool down")
            if self.mode == "nan":
                return StepResult("", math.nan, True, {})
            if self.mode == "not str":
                return (None, 0.0, False, {})
            if self.mode == "garbage":
                return "garbage"
            return super().step(action)

        def close(self):
            self.closed = True

    BROKEN = ["ok", "reset", "raise", "nan", "not str", "garbage", "ok", "ok", "ok", "ok"]
    CLOSED = []
    stats = {}
    eng = ScriptedEngine(tok, lambda _: "5<eos>")
    groups = workflow(eng, [_task(task_id="a"), _task(task_id="b")], SamplingParams(n=5, max_new_tokens=8),
                      version=3, team=TEAM, producer_id="test", env=Flaky, limits=TurnLimits(), stats=stats)
    check_wire(groups)
    # task a: ok + 4 failures (1 of 5 normal < half of 5 -> dropped); task b: 5 normal
    assert [g.task.task_id for g in groups] == ["b"]
    assert {t.finish_reason for t in groups[0].trajectories} == {"env_done"}
    assert stats.pop("env_s") >= 0
    assert stats == {"env_errors": 5, "groups_dropped_env": 1}
    assert len(CLOSED) == 10 and all(e.closed for e in CLOSED)  # close() on every environment, whatever happened
    # with min_episodes=1 task a goes out with its one normal episode
    Flaky.made, CLOSED[:] = 0, []
    groups = workflow(eng, [_task(task_id="a")], SamplingParams(n=5, max_new_tokens=8), version=3, team=TEAM,
                      producer_id="test", env=Flaky, limits=TurnLimits(), min_episodes=1)
    assert [len({t.info["episode_id"] for t in g.trajectories}) for g in groups] == [1]


# ---- batching and groups ----

def bisect(text: str) -> str:
    """Binary search over 1-8, reading its guesses and the feedback from the plain transcript."""
    lo, hi = 1, 8
    for guess, word in re.findall(r"(\d)<eos>(higher|lower)", text):
        lo, hi = (int(guess) + 1, hi) if word == "higher" else (lo, int(guess) - 1)
    return f"{(lo + hi) // 2}<eos>"


def test_all_episodes_of_a_call_share_one_generate_per_turn(tok):
    tasks = [_task(s, task_id=f"t{s}") for s in ("1", "5", "8")]
    eng = ScriptedEngine(tok, bisect)
    groups = run(multi_turn, eng, tasks, n=4)
    assert [len(c[0]) for c in eng.calls] == [12, 12, 12, 4]  # 4, 2, 1 / 4, 6, 5 / 4, 6, 7, 8
    assert all(p.n == 1 for _, p in eng.calls)
    assert [g.task.task_id for g in groups] == ["t1", "t5", "t8"]
    for g in groups:
        assert len(g.trajectories) == 4 and len({t.info["episode_id"] for t in g.trajectories}) == 4
        assert all(t.task_id == g.task.task_id and t.finish_reason == "env_done" for t in g.trajectories)
    assert [g.trajectories[0].info["turns"] for g in groups] == [3, 3, 4]
    assert [g.trajectories[0].env_reward for g in groups] == pytest.approx([0.9, 0.9, 0.85])


# ---- step_wise ----

def test_step_wise_gives_one_trajectory_per_turn_sharing_the_episode_reward(tok):
    eng = ScriptedEngine(tok, guesses("4<eos>", "6<eos>", "5<eos>"))
    (group,) = run(step_wise, eng, [_task("5")], n=2)
    trajs = group.trajectories
    assert len(trajs) == 6
    script = guesses("4<eos>", "6<eos>", "5<eos>")
    (concat,) = run(multi_turn, ScriptedEngine(tok, script), [_task("5")])[0].trajectories
    episode = trajs[:3]
    assert len({t.info["episode_id"] for t in trajs}) == 2 and len({t.info["episode_id"] for t in episode}) == 1
    assert [t.info["step"] for t in trajs] == [0, 1, 2, 0, 1, 2] and {t.info["num_steps"] for t in trajs} == {3}
    assert [t.finish_reason for t in episode] == ["stop", "stop", "env_done"]
    assert all(t.env_reward == pytest.approx(0.9) for t in trajs)
    assert [t.info["step_reward"] for t in episode] == [0.0, 0.0, pytest.approx(0.9)]
    # step k: the history before turn k as prompt, the turn's sampled tokens as response (mask all 1)
    full = concat.prompt_ids + concat.response_ids
    starts = [len(concat.prompt_ids), len(concat.prompt_ids) + 9, len(concat.prompt_ids) + 17]
    for t, start in zip(episode, starts):
        assert t.prompt_ids == full[:start] and t.response_ids == full[start:start + 2]
        assert t.loss_mask is None and t.logprobs == [LP, LP]
    assert [t.response_text for t in episode] == ["4", "6", "5"]


# ---- chat template ----

def test_chat_template_turns_and_their_mask(chat_tok):
    tok = chat_tok
    eng = ScriptedEngine(tok, guesses("4<eos>", "5<eos>"))
    (t,) = run(multi_turn, eng, [_task("5")], chat=True)[0].trajectories
    bos, eos = tok.bos_token_id, tok.eos_token_id
    assert t.prompt_ids == [bos] + ids(tok, "u:guess 1-8:") + [eos] + ids(tok, "\n") + [bos] + ids(tok, "a:")
    # the model's <eos> closes its turn (the template's copy is dropped); "\n", the user turn and
    # the generation prompt are the template's and the environment's: mask 0
    between = ids(tok, "\n") + [bos] + ids(tok, "u:higher:") + [eos] + ids(tok, "\n") + [bos] + ids(tok, "a:")
    assert t.response_ids == ids(tok, "4") + [eos] + between + ids(tok, "5") + [eos]
    assert t.loss_mask == [1, 1] + [0] * len(between) + [1, 1]
    assert t.env_reward == pytest.approx(0.95) and t.finish_reason == "env_done"
    steps = run(step_wise, ScriptedEngine(tok, guesses("4<eos>", "5<eos>")), [_task("5")], chat=True)[0].trajectories
    assert steps[1].prompt_ids == t.prompt_ids + t.response_ids[:2 + len(between)]


def test_chat_turn_without_the_models_stop_token_keeps_the_templates(chat_tok):
    enc = TurnEncoder(chat_tok, chat=True)
    tail = ids(chat_tok, "\n") + [chat_tok.bos_token_id] + ids(chat_tok, "u:x") + [chat_tok.eos_token_id] \
        + ids(chat_tok, "\n") + [chat_tok.bos_token_id] + ids(chat_tok, "a:")
    assert enc.between("x", stop_id=None) == [chat_tok.eos_token_id] + tail
    assert enc.between("x", stop_id=chat_tok.eos_token_id) == tail
    assert enc.between("x", stop_id=ids(chat_tok, "4")[0]) == [chat_tok.eos_token_id] + tail  # not the template's
    assert TurnEncoder(chat_tok, chat=False).between("x", stop_id=chat_tok.eos_token_id) == ids(chat_tok, "x")


def test_a_template_that_rewrites_assistant_content_is_refused(chat_tok):
    chat_tok.chat_template = "{% for m in messages %}{{ m['content'][:3] }}{% endfor %}"
    with pytest.raises(ValueError, match="verbatim"):
        TurnEncoder(chat_tok, chat=True).between("x", stop_id=None)


# ---- make_workflow: config to callable ----

def test_make_workflow_binds_environment_and_limits(tok):
    assert list(WORKFLOWS) == ["single_turn", "multi_turn", "step_wise"]
    assert make_workflow(ExplorerConfig()) is single_turn
    ex = ExplorerConfig(workflow="step_wise", env={"type": "guess_number", "params": {"max_guesses": 2}},
                        max_turns=5, max_total_tokens=64)
    wf = make_workflow(ex)
    assert wf.func is step_wise and wf.keywords["limits"] == TurnLimits(5, 64)
    assert wf.keywords["env"]().max_guesses == 2
    groups = wf(ScriptedEngine(tok, lambda _: "1<eos>"), [_task("8")], SamplingParams(n=1), version=0, team=TEAM)
    check_wire(groups)
    assert [t.info["env_info"]["outcome"] for t in groups[0].trajectories] == ["lost", "lost"]


def my_workflow(engine, tasks, params, *, version, team, producer_id="", chat=False, env=None, limits=None):
    """A user's workflow: a multi-turn run that records what it was given."""
    groups = multi_turn(engine, tasks, params, version=version, team=team, env=env, limits=limits)
    for g in groups:
        for t in g.trajectories:
            t.info["mine"] = limits.max_turns
    return groups


def test_a_users_workflow_and_environment_by_import_path(tok):
    ex = ExplorerConfig(workflow_import_path=f"{__name__}:my_workflow", max_turns=3,
                        env={"import_path": "tests_helpers:Countdown", "params": {"start": 2}})
    eng = ScriptedEngine(tok, lambda text: ("1" if text.count(":") > 1 else "2") + "<eos>")  # " next:" was said
    (group,) = make_workflow(ex)(eng, [_task("", "count:")], SamplingParams(n=2), version=0, team=TEAM)
    check_wire([group])
    assert all(t.info["mine"] == 3 and t.env_reward == 1.0 for t in group.trajectories)
    assert group.trajectories[0].response_ids == ids(tok, "2<eos> next:1<eos>")


# ---- held-out eval of a multi-turn run ----

@pytest.mark.parametrize("workflow", ["multi_turn", "step_wise"])
def test_eval_plays_greedy_episodes_scored_with_the_env_term(tok, workflow):
    from streamrft.config import parse_config
    from streamrft.producers.evaluate import evaluate_run

    cfg = parse_config({"model": {"path": "unused"}, "stream_ops": {"rewards": [{"name": "env"}]},
                        "explorer": {"workflow": workflow, "env": {"type": "guess_number"}, "group_size": 8}})
    eng = ScriptedEngine(tok, bisect)
    score = evaluate_run(eng, [_task("1"), _task("4", task_id="t4")], cfg)  # bisect: 3 turns (0.9), 1 turn (1.0)
    assert all(p.n == 1 and p.temperature == 0.0 for _, p in eng.calls)
    assert score == pytest.approx((0.9 + 1.0) / 2 if workflow == "multi_turn" else (3 * 0.9 + 1.0) / 4)


def test_eval_of_a_single_turn_run_is_unchanged(tok):
    from streamrft.config import parse_config
    from streamrft.producers.evaluate import evaluate_run

    cfg = parse_config({"model": {"path": "unused"}, "stream_ops": {"rewards": [{"name": "exact_match"}]}})
    eng = ScriptedEngine(tok, lambda text: "4<eos>")
    assert evaluate_run(eng, [_task("4"), _task("5", task_id="t5")], cfg) == 0.5
    ((prompts, params),) = eng.calls
    assert len(prompts) == 2 and (params.n, params.temperature) == (1, 0.0)


def test_single_turn_eval_gives_a_reward_the_task_it_asks_for(tok, tmp_path, monkeypatch):
    from streamrft.config import parse_config
    from streamrft.producers.evaluate import evaluate_run

    (tmp_path / "my_task_reward.py").write_text(
        "def weighted(response, answer, *, task):\n    return task.metadata['w'] * (response == answer)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = parse_config({"model": {"path": "unused"},
                        "stream_ops": {"rewards": [{"import_path": "my_task_reward:weighted"}]}})
    tasks = [_task("4"), _task("4", task_id="t5")]
    tasks[0].metadata, tasks[1].metadata = {"w": 3.0}, {"w": 1.0}
    assert evaluate_run(ScriptedEngine(tok, lambda text: "4<eos>"), tasks, cfg) == 2.0  # (3 + 1) / 2



@pytest.mark.parametrize("workflow", ["single_turn", "multi_turn"])
def test_a_sampled_eval_plays_samples_per_task_at_its_temperature_and_seed(tok, workflow):
    from streamrft.config import parse_config
    from streamrft.producers.evaluate import evaluate_run

    turns = {"workflow": workflow, "env": {"type": "guess_number"}} if workflow == "multi_turn" else {}
    cfg = parse_config({"model": {"path": "unused"}, "eval": {"temperature": 0.7, "samples": 3, "seed": 5},
                        "stream_ops": {"rewards": [{"name": "env" if turns else "exact_match"}]},
                        "explorer": {**turns, "sampling": {"top_p": 0.9, "top_k": 7}}})
    eng = ScriptedEngine(tok, bisect if turns else (lambda text: "4<eos>"))
    score = evaluate_run(eng, [_task("1"), _task("4", task_id="t4")], cfg)
    first_prompts, first = eng.calls[0]
    assert (first.temperature, first.top_p, first.top_k, first.seed) == (0.7, 0.9, 7, 5)
    if turns:  # 3 episodes of each task in lockstep, one prompt each; turn k seeded seed + k
        assert len(first_prompts) == 6 and first.n == 1
        assert [p.seed for _, p in eng.calls] == [5 + k for k in range(len(eng.calls))]
        assert score == pytest.approx((0.9 + 1.0) / 2)  # the scripted player is the same every sample
    else:  # one call, 3 completions of each prompt
        assert len(eng.calls) == 1 and len(first_prompts) == 2 and first.n == 3
        assert score == 0.5


def test_a_sampled_eval_on_the_real_engine_repeats_with_its_seed_and_leaves_the_rng_alone(engine, tmp_path,
                                                                                          monkeypatch):
    from streamrft.config import parse_config
    from streamrft.producers.evaluate import evaluate_run

    (tmp_path / "length_reward.py").write_text("def length(response, answer):\n    return float(len(response))\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def cfg(**ev):
        return parse_config({"model": {"path": "unused"}, "eval": ev,
                             "explorer": {"sampling": {"max_new_tokens": 8}},
                             "stream_ops": {"rewards": [{"import_path": "length_reward:length"}]}})

    tasks = [Task(**row) for row in guess_number.make_tasks(3, seed=1)]
    rng = torch.get_rng_state()
    sampled = evaluate_run(engine, tasks, cfg(temperature=1.0, samples=4, seed=3))
    assert torch.equal(torch.get_rng_state(), rng)  # a seeded eval forks the RNG: the explorer's draws are its own
    assert evaluate_run(engine, tasks, cfg(temperature=1.0, samples=4, seed=3)) == sampled
    assert evaluate_run(engine, tasks, cfg(temperature=1.0, samples=4, seed=4)) != sampled
    greedy = evaluate_run(engine, tasks, cfg())
    assert greedy == evaluate_run(engine, tasks, cfg()) and greedy != sampled


# ---- end to end on the real engine ----

@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = tmp_path_factory.mktemp("agent-tiny")
    build_tiny_model(path, build_char_tokenizer(ALPHABET), hidden_size=32, layers=2, heads=4, seed=0)
    torch.set_num_threads(1)
    return TransformersEngine(str(path), max_batch=16)


def _teacher_forced(engine, prompt: list[int], response: list[int]) -> list[float]:
    with torch.no_grad():
        logits = engine.model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1]
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0].tolist()


@pytest.mark.parametrize("chat", [False, True], ids=["plain", "chat"])
def test_real_engine_episodes_end_to_end(engine, chat, monkeypatch):
    tok = engine.tokenizer
    monkeypatch.setattr(tok, "chat_template", CHATML if chat else None)
    # every character stops a turn, so the untrained model plays several one-character turns
    chars = [i for i in range(len(tok)) if i not in tok.all_special_ids]
    params = SamplingParams(n=3, max_new_tokens=4, temperature=1.0, seed=0, stop_token_ids=chars)
    tasks = [Task(**row) for row in guess_number.make_tasks(2, seed=1)]
    for workflow in (multi_turn, step_wise):
        groups = workflow(engine, tasks, params, version=0, team=TEAM, chat=chat, env=env_factory("guess_number"),
                          limits=TurnLimits(max_turns=4, max_total_tokens=100))
        check_wire(groups)
        assert [g.task.task_id for g in groups] == [t.task_id for t in tasks]
        for g in groups:
            assert len({t.info["episode_id"] for t in g.trajectories}) == 3
            for t in g.trajectories:
                model_pos = [i for i, m in enumerate(t.mask()) if m]
                if not model_pos:
                    continue
                expected = _teacher_forced(engine, t.prompt_ids, t.response_ids)
                assert [t.logprobs[i] for i in model_pos] == pytest.approx([expected[i] for i in model_pos], abs=1e-4)
                assert t.finish_reason in ("stop", "env_done", "max_turns", "length", "max_total_tokens")
                if workflow is multi_turn:  # one run of mask-1 tokens per model turn
                    runs = sum(1 for i in model_pos if i == 0 or t.mask()[i - 1] == 0)
                    assert t.info["turns"] == runs and t.env_reward == sum(t.info["step_rewards"])


# ---- warm-up demonstrations: scripted episodes in the workflow's own layout ----
@pytest.mark.parametrize("secret", ["5", "8", "1"])
@pytest.mark.parametrize("chat", [False, True])
def test_a_demonstration_is_laid_out_as_the_multi_turn_workflow_lays_out_the_models_episode(tok, chat_tok, secret, chat):
    tokenizer = chat_tok if chat else tok
    task = _task(secret)
    demo = demonstration(tokenizer, task, GuessNumber(), guess_number.play_bisect, name="bisect", chat=chat)
    # the same actions, sampled by an engine through the real workflow
    actions = {"5": ("4", "6", "5"), "8": ("4", "6", "7", "8"), "1": ("4", "2", "1")}[secret]
    eng = ScriptedEngine(tokenizer, guesses(*(a + "<eos>" for a in actions)))
    (group,) = run(multi_turn, eng, [task], chat=chat)
    (t,) = group.trajectories
    assert demo.ids == t.prompt_ids + t.response_ids
    assert demo.loss_mask == [0] * len(t.prompt_ids) + t.loss_mask
    assert demo.env_reward == pytest.approx(t.env_reward)


def test_scripted_players_rewards_over_every_secret():
    def mean_reward(player):
        rewards = [demonstration(build_char_tokenizer(ALPHABET), _task(str(s)), GuessNumber(), player).env_reward
                   for s in range(1, 9)]
        return sum(rewards) / 8

    # bisect: 4 wins at once (1.0); 2, 6 on the 2nd guess (0.95); 1, 3, 5, 7 on the 3rd (0.9); 8 on the 4th (0.85)
    assert mean_reward(guess_number.play_bisect) == pytest.approx((1 + 2 * 0.95 + 4 * 0.9 + 0.85) / 8)
    # linear: 1, 2, 3, 4 won at guesses 1-4; 5-8 lost after 4 guesses
    assert mean_reward(guess_number.play_linear) == pytest.approx((1 + 0.95 + 0.9 + 0.85) / 8)


def test_tool_player_calls_the_calculator_then_copies_its_result(tok):
    task = Task(task_id="c", prompt="17*23?", answer="391")
    demo = demonstration(tok, task, calculator.Calculator(), calculator.play_tool)
    eos, bos = tok.eos_token_id, tok.bos_token_id
    assert demo.ids == [bos] + ids(tok, "17*23?") + ids(tok, "calc(17*23)") + [eos] + ids(tok, "=391\n") + ids(tok, "391") + [eos]
    n_prompt, n_call, n_result = 1 + 6, len("calc(17*23)") + 1, len("=391\n")
    assert demo.loss_mask == [0] * n_prompt + [1] * n_call + [0] * n_result + [1] * 4
    assert demo.env_reward == 1.0
    assert demonstration(tok, task, calculator.Calculator(), calculator.play_direct).ids == \
        [bos] + ids(tok, "17*23?") + ids(tok, "391") + [eos]


def test_a_mixture_draws_players_by_weight_and_checks_them(tok):
    tasks = [_task(str(1 + i % 8), task_id=f"t{i}") for i in range(400)]
    demos = mixture(tok, tasks, GuessNumber, guess_number.PLAYERS, {"linear": 0.75, "bisect": 0.25}, seed=3)
    share = sum(d.player == "bisect" for d in demos) / len(demos)
    assert 0.19 < share < 0.31
    assert mixture(tok, tasks[:20], GuessNumber, guess_number.PLAYERS, {"linear": 0.75, "bisect": 0.25}, seed=3) \
        == demos[:20]  # deterministic in the seed
    with pytest.raises(ValueError, match=r"\['nope'\] are not among \['bisect', 'linear'\]"):
        mixture(tok, tasks, GuessNumber, guess_number.PLAYERS, {"nope": 1.0})
    with pytest.raises(ValueError, match="positive sum"):
        mixture(tok, tasks, GuessNumber, guess_number.PLAYERS, {"linear": 0.0})


def test_a_demonstration_longer_than_the_episode_budget_is_refused(tok):
    with pytest.raises(ValueError, match="max_total_tokens=20"):
        demonstration(tok, _task("8"), GuessNumber(), guess_number.play_linear, limits=TurnLimits(8, 20))
