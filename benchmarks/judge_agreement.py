"""How well a judge model agrees with the reversal rule on held-out strings (examples/judge_cpu.yaml).

Draws responses like a warmed-up policy's (`producers.judge_data.corrupt`) to strings of the eval
split, which the judge never saw, asks the judge through the same `judge` reward the stream-ops
worker runs (rubric prompt, greedy answer, parsed score), and compares with the rule
(`rewards.reverse`). Prints exact agreement on the digit, mean absolute error, Pearson correlation,
malformed answers, and the share of response pairs of one task that the judge orders as the rule
does (what GRPO's group-relative advantages need), next to a judge that guesses at random.

    streamrft prepare examples/judge_model_cpu.yaml
    python benchmarks/judge_agreement.py [--model out/judge_model/stage-0-sft] [--n 400]

With `--policy DIR ...` (a policy's HF directory, e.g. the judge run's warmed-up base and its last
version from `streamrft export`), it also scores each policy's greedy answers to the demo's
held-out tasks by both the judge and the rule: whether a run that learned by the judge's scores
also improved by the rule's.
"""
from __future__ import annotations

import argparse
import itertools
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from streamrft.producers.judge_data import JUDGE_MAX_NEW_TOKENS, JUDGE_TEMPLATE, SCORE_MAX, corrupt
from streamrft.producers.synthetic import make_demo_tasks
from streamrft.schemas import Task
from streamrft.stream_ops.rewards.judge import make_judge
from streamrft.stream_ops.rewards.reverse import reverse_reward
from streamrft.stream_ops.rewards.rubric import MalformedAnswer


def pair_order_agreement(judge: list[list[float]], rule: list[list[float]]) -> float:
    """Share of a task's response pairs with unequal rule scores that the judge orders the same way
    (a tie in the judge counts half)."""
    agree = total = 0.0
    for js, rs in zip(judge, rule):
        for i, j in itertools.combinations(range(len(rs)), 2):
            if rs[i] == rs[j]:
                continue
            total += 1
            d = (js[i] - js[j]) * (rs[i] - rs[j])
            agree += 1.0 if d > 0 else 0.5 if d == 0 else 0.0
    return agree / total if total else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="out/judge_model/stage-0-sft")
    ap.add_argument("--n", type=int, default=400, help="tasks (each with --group responses)")
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--policy", nargs="*", default=[], help="policy directories to score by judge and rule")
    ap.add_argument("--eval-size", type=int, default=100, help="held-out tasks per policy (the demo's data.eval)")
    a = ap.parse_args()

    judge = make_judge(model=a.model, backend="local", template=JUDGE_TEMPLATE, score_range=[0, SCORE_MAX],
                       max_new_tokens=JUDGE_MAX_NEW_TOKENS, chat_template=False, batch_size=64)
    rng = random.Random(a.seed)
    items = []  # (task index, task, response)
    for k, row in enumerate(make_demo_tasks(a.n, seed=a.seed, split="eval")):
        task = Task(task_id=row["task_id"], prompt=row["prompt"], answer=row["answer"])
        items += [(k, task, corrupt(row["answer"], rng)) for _ in range(a.group)]

    def ask(item) -> float | None:
        _, task, response = item
        try:
            return judge(response, task.answer, task=task)
        except MalformedAnswer:
            return None

    t0 = time.perf_counter()
    with ThreadPoolExecutor(64) as pool:  # concurrent calls, as a worker's records: the batcher batches them
        scores = list(pool.map(ask, items))
    wall = time.perf_counter() - t0
    malformed = sum(s is None for s in scores)
    judged = [[] for _ in range(a.n)]
    ruled = [[] for _ in range(a.n)]
    for (k, task, response), score in zip(items, scores):
        judged[k].append(0.0 if score is None else score)
        ruled[k].append(reverse_reward(response, task.answer))
    flat_j = [x for js in judged for x in js]
    flat_r = [x for rs in ruled for x in rs]
    digits_j = [round(SCORE_MAX * x) for x in flat_j]
    digits_r = [round(SCORE_MAX * x) for x in flat_r]
    shuffled = [[rng.random() for _ in rs] for rs in ruled]
    n = len(flat_j)
    print(f"judge {a.model} on {a.n} held-out tasks x {a.group} responses ({n} judged, {wall:.1f} s, "
          f"{n / wall:.0f} judgements/s, batches of up to 64)")
    print(f"  exact digit agreement  {sum(x == y for x, y in zip(digits_j, digits_r)) / n:.3f}")
    print(f"  within one digit       {sum(abs(x - y) <= 1 for x, y in zip(digits_j, digits_r)) / n:.3f}")
    print(f"  mean abs error (0-1)   {statistics.fmean(abs(x - y) for x, y in zip(flat_j, flat_r)):.3f}")
    print(f"  pearson r              {statistics.correlation(flat_j, flat_r):.3f}")
    print(f"  malformed answers      {malformed}")
    print(f"  pair order agreement   {pair_order_agreement(judged, ruled):.3f} "
          f"(random judge: {pair_order_agreement(shuffled, ruled):.3f})")
    for policy in a.policy:
        by_judge, by_rule = policy_scores(judge, policy, a.eval_size)
        print(f"policy {policy}: greedy eval on {a.eval_size} held-out tasks, judge {by_judge:.3f}, rule {by_rule:.3f}")


def policy_scores(judge, policy: str, n: int) -> tuple[float, float]:
    """Mean judge and rule reward of `policy`'s greedy answers (10 new tokens, as the demo's eval)
    to the demo's first `n` held-out tasks (`data.synthetic` seed 0)."""
    from streamrft.stream_ops.rewards.local_model import LocalLM

    rows = make_demo_tasks(n, seed=0, split="eval")
    answers = LocalLM(policy, chat=False).generate([r["prompt"] for r in rows], max_new_tokens=10)
    tasks = [Task(task_id=r["task_id"], prompt=r["prompt"], answer=r["answer"]) for r in rows]

    def ask(pair) -> float:
        response, task = pair
        try:
            return judge(response, task.answer, task=task)
        except MalformedAnswer:
            return 0.0

    with ThreadPoolExecutor(64) as pool:
        judged = list(pool.map(ask, zip(answers, tasks)))
    return statistics.fmean(judged), statistics.fmean(reverse_reward(x, r["answer"]) for x, r in zip(answers, rows))


if __name__ == "__main__":
    main()
