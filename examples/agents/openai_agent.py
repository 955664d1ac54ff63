"""An outside team's agent that trains a streamrft run through the rollout gateway, with nothing but
the official `openai` package (and httpx, which it brings) -- no streamrft import.

The agent plays guess-the-number (secret in 1-8, at most 4 guesses; "higher:", "lower:" and
"invalid:" as feedback) against the gateway's policy. Each round it plays `--groups` secrets,
`--group-size` episodes each, all at once (the gateway batches the calls). Every call names its
episode and group in headers, and each episode ends with a POST of its reward to
`/v1/episodes/{id}/finish`: the gateway turns the calls into trajectories with the exact sampled
tokens and log-probs and publishes each full group to the run. Every `--eval-every` rounds it plays
every secret greedily as eval episodes (served, never trained on) and prints that reward.

    export STREAMRFT_AGENTS_KEY=sk-agents-demo
    streamrft run examples/gateway_cpu.yaml &
    python examples/agents/openai_agent.py --base-url http://127.0.0.1:8000/v1

Started before the gateway serves (`streamrft run` prepares and warms up the model first, which
takes minutes), it waits for `/health` up to `--wait-minutes`. Each episode is finished as soon as
it is played, so a group is published the moment its last episode ends. It stops after `--minutes`
or `--rounds`, or when the gateway goes away (the run ended).
"""
from __future__ import annotations

import argparse
import os
import random
import re
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
from openai import OpenAI

LOW, HIGH, MAX_GUESSES, TURN_PENALTY = 1, 8, 4, 0.05
GUESS = re.compile(r"-?\d{1,9}")


def complete(client: OpenAI, **request):
    """One completion; a 429 (admission control: the trainer is behind) is waited out as its
    Retry-After says, for as long as it takes."""
    while True:
        try:
            return client.completions.create(**request)
        except openai.RateLimitError as e:
            time.sleep(float(e.response.headers.get("retry-after", 1)))


def play(client: OpenAI, model: str, secret: int, episode: dict | None = None, greedy: bool = False) -> tuple[float, int]:
    """One game: (reward, the weight version that served the last call). `episode` holds the ids
    sent as headers; the prompt of each call is the whole game so far, as text."""
    prompt, version = f"guess {LOW}-{HIGH}:", 0
    headers = {k: str(v) for k, v in (episode or {}).items()}
    for guess_no in range(1, MAX_GUESSES + 1):
        out = complete(client, model=model, prompt=prompt, max_tokens=4, temperature=0.0 if greedy else 1.0,
                       extra_headers=headers)
        choice, version = out.choices[0], int((out.system_fingerprint or "v0")[1:])
        if choice.finish_reason != "stop":
            return 0.0, version  # a cut-off answer is never played
        text = choice.text.strip()
        guess = int(text) if GUESS.fullmatch(text) else None
        if guess == secret:
            return max(0.0, 1.0 - TURN_PENALTY * (guess_no - 1)), version
        if guess_no == MAX_GUESSES:
            return 0.0, version
        feedback = "invalid:" if guess is None else ("higher:" if secret > guess else "lower:")
        prompt += choice.text + feedback
    return 0.0, version


def finish(base_url: str, key: str, episode_id: str, reward: float, task_id: str) -> dict:
    """Close an episode with its reward; retried while the broker has not acknowledged the group (503)."""
    for attempt in range(30):
        r = httpx.post(f"{base_url}/episodes/{episode_id}/finish", json={"reward": reward, "task_id": task_id},
                       headers={"Authorization": f"Bearer {key}"}, timeout=120)
        if r.status_code != 503:  # 503: the broker has not acknowledged the group yet
            r.raise_for_status()
            return r.json()
        time.sleep(float(r.headers.get("Retry-After", 2)))
    raise RuntimeError(f"episode {episode_id}: the group was never acknowledged")


def wait_healthy(base_url: str, minutes: float) -> bool:
    """Until the gateway answers `/health` (no key needed), for at most `minutes`."""
    root, deadline, said = base_url.rstrip("/").removesuffix("/v1"), time.monotonic() + minutes * 60, False
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{root}/health", timeout=5).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        if not said:
            print(f"agent: waiting for the gateway at {root} (a run prepares and warms up its model before it "
                  f"serves: minutes; at most {minutes:g})", flush=True)
            said = True
        time.sleep(2)
    return False


def train_round(client: OpenAI, pool: ThreadPoolExecutor, args, rng: random.Random) -> tuple[float, int]:
    def episode(secret: int, ids: dict) -> tuple[float, int]:  # played, then finished at once
        reward, version = play(client, args.model, secret, ids)
        finish(args.base_url, args.api_key, ids["X-Episode-Id"], reward, task_id=f"secret-{secret}-{ids['X-Group-Id']}")
        return reward, version

    games = []
    for _ in range(args.groups):
        secret, group = rng.randint(LOW, HIGH), uuid.uuid4().hex
        for _ in range(args.group_size):
            ids = {"X-Episode-Id": uuid.uuid4().hex, "X-Group-Id": group, "X-Group-Size": args.group_size}
            games.append(pool.submit(episode, secret, ids))
    results = [g.result() for g in games]
    return sum(r for r, _ in results) / len(results), max(v for _, v in results)


def evaluate(client: OpenAI, pool: ThreadPoolExecutor, model: str) -> float:
    """Greedy play of every secret as eval episodes: served with the same token layout as training
    episodes, never trained on."""
    def one(secret: int) -> float:
        return play(client, model, secret, {"X-Episode-Id": uuid.uuid4().hex, "X-Episode-Eval": "true"}, greedy=True)[0]

    rewards = list(pool.map(one, range(LOW, HIGH + 1)))
    return sum(rewards) / len(rewards)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    p.add_argument("--api-key", default=os.environ.get("STREAMRFT_AGENTS_KEY"), help="the team's key "
                   "(default: $STREAMRFT_AGENTS_KEY)")
    p.add_argument("--model", default="policy")
    p.add_argument("--groups", type=int, default=4, help="secrets played at once per round")
    p.add_argument("--group-size", type=int, default=8, help="episodes per secret (the group)")
    p.add_argument("--eval-every", type=int, default=5, help="rounds between two greedy evals")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--minutes", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--wait-minutes", type=float, default=15.0, help="how long to wait for the gateway to serve")
    args = p.parse_args()
    if not args.api_key:
        p.error("no key: pass --api-key or set STREAMRFT_AGENTS_KEY")
    if not wait_healthy(args.base_url, args.wait_minutes):
        print(f"agent: no gateway answered at {args.base_url} within {args.wait_minutes:g} minutes", flush=True)
        return 1
    client = OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=2, timeout=120)
    rng, start = random.Random(args.seed), time.monotonic()
    pool = ThreadPoolExecutor(args.groups * args.group_size)
    evals, n = [], 0
    try:
        evals.append(evaluate(client, pool, args.model))
        print(f"agent: eval at start {evals[0]:.3f}", flush=True)
        while (args.rounds is None or n < args.rounds) and (args.minutes is None or
                                                            time.monotonic() - start < args.minutes * 60):
            reward, version = train_round(client, pool, args, rng)
            n += 1
            line = f"agent: round {n} v{version}: train reward {reward:.3f}"
            if n % args.eval_every == 0:
                evals.append(evaluate(client, pool, args.model))
                line += f" | eval {evals[-1]:.3f}"
            print(line, flush=True)
        evals.append(evaluate(client, pool, args.model))
    except (openai.APIConnectionError, httpx.TransportError):
        # refused, reset or cut mid-answer: a run that ends closes its gateway under calls in flight
        print("agent: the gateway went away (the run ended)", flush=True)
    finally:
        pool.shutdown(cancel_futures=True)
    if evals:
        print(f"agent: rounds={n} eval_start={evals[0]:.3f} eval_end={evals[-1]:.3f} eval_best={max(evals):.3f}",
              flush=True)
    else:
        print(f"agent: rounds={n} (no eval finished)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
