"""SmolLM2 rollouts as explorers make them: chat-template masks in multi-turn episodes, and recorded
behaviour log-probs equal to the trainer's teacher-forced recomputation at the same weights."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from streamrft.config import ExplorerConfig  # noqa: E402
from streamrft.consumers.batch import collate, token_logprobs  # noqa: E402
from streamrft.engine.rollout.base import SamplingParams  # noqa: E402
from streamrft.producers.envs.guess_number import GuessNumber  # noqa: E402
from streamrft.producers.workflows import make_workflow, single_turn  # noqa: E402
from streamrft.schemas import Task  # noqa: E402

pytestmark = pytest.mark.real_model

GUESS = "Guess my secret number between 1 and 8. Reply with just the number."
EXPLORER = ExplorerConfig(workflow="multi_turn", env={"type": "guess_number", "params": {"max_guesses": 2}},
                          max_turns=2, max_total_tokens=256)


@pytest.fixture(scope="module")
def episodes(smollm2):
    """n=2 guess-the-number episodes of at most 2 turns through the chat template. Greedy: SmolLM2 answers
    "The number is 12." and stops, so a second turn is certain (sampled at temperature 1, 8 tokens end
    without a stop about half the time, and such an episode ends after its first turn)."""
    task = Task(task_id="t5", prompt=GUESS, answer="5")
    params = SamplingParams(n=2, max_new_tokens=8, temperature=0.0)
    groups = make_workflow(EXPLORER)(smollm2, [task], params, version=0, team="t", chat=True)
    return [(g.task, t) for g in groups for t in g.trajectories]


def runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """(value, start, stop) of each run of equal values in `mask`."""
    out, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((mask[start], start, i))
            start = i
    return out


def test_chat_template_tokens_between_turns_are_masked(smollm2, episodes):
    tok = smollm2.tokenizer
    two_turns = 0
    for task, t in episodes:
        segments = runs(t.loss_mask)
        assert segments[0][0] == 1  # the response opens with the model's own tokens
        env = GuessNumber(max_guesses=2)
        env.reset(task)
        for value, start, stop in segments:
            ids, lps = t.response_ids[start:stop], t.logprobs[start:stop]
            if value == 1:  # the model's sampled turn, ending with <|im_end|> when it stopped
                assert all(lp <= 0.0 for lp in lps)
                observation = env.step(tok.decode(ids, skip_special_tokens=True)).observation
            else:  # the template's close of the turn, the observation as a user turn, the generation prompt
                assert lps == [0.0] * len(ids)
                assert tok.decode(ids, skip_special_tokens=False) == (
                    f"\n<|im_start|>user\n{observation}<|im_end|>\n<|im_start|>assistant\n")
                two_turns += 1
                user_turn = f"<|im_start|>user\n{observation}<|im_end|>"
        assert [value for value, _, _ in segments] == [1, 0, 1]  # model turn, template + observation, model turn
        assert sum(lp for lp, m in zip(t.logprobs, t.loss_mask) if m) < 0.0  # the model's tokens carry log-probs
        assert t.response_ids[segments[0][2] - 1] == tok.eos_token_id  # the model closed its own first turn
        assert user_turn in tok.decode(t.response_ids)  # the observation, inside a user turn
        assert tok.decode(t.prompt_ids).endswith(f"<|im_start|>user\n{GUESS}<|im_end|>\n<|im_start|>assistant\n")
    assert two_turns == 2, "an episode did not reach its second turn: nothing between turns was checked"


def test_recorded_logprobs_equal_teacher_forced_recomputation(smollm2, episodes):
    """The trainer's view (right-padded `collate`, `token_logprobs` at the sampling temperature) of what
    the explorer recorded (left-padded, KV-cached `generate`): single-turn prompts of different lengths
    and the multi-turn episodes, whose later turns were generated after the template's tokens."""
    prompts = ["What is 2 + 2?", "Name one colour of the rainbow, in one word, and nothing else please."]
    tasks = [Task(task_id=f"s{i}", prompt=p) for i, p in enumerate(prompts)]
    params = SamplingParams(n=2, max_new_tokens=8, temperature=1.0, seed=1)
    groups = single_turn(smollm2, tasks, params, version=0, team="t", chat=True)
    trajectories = [t for g in groups for t in g.trajectories] + [t for _, t in episodes]
    batch = collate([(t, 0.0, 0.0) for t in trajectories], smollm2.tokenizer.pad_token_id)
    with torch.no_grad():
        logp, _ = token_logprobs(smollm2.model, batch, temperature=1.0)
    on = batch.mask > 0
    assert on.sum() >= 40
    diff = (logp[on] - batch.old_logprobs[on]).abs().max().item()
    assert diff <= 1e-4, diff
