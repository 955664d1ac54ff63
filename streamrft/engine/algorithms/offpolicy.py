"""How off-policy a batch is, as AReaL and verl tell their users to watch it (pure, unit-tested).

`OffPolicyStats` accumulates, over the micro-batches of one training step, the behaviour importance
weight of every scored token, w = exp(logp - behaviour logp): logp under the trainer's weights when
the token is trained, the behaviour log-prob under the weights that sampled it. With one update per
batch, w is exactly how far the trainer's policy has moved from the one that played the episode.

- `iw_mean`, `iw_max`: the weight's mean and largest value over the step's tokens;
- `iw_ess`: its effective sample size as a share of the tokens, (sum w)^2 / (n sum w^2), in (0, 1]:
  1 when every weight is equal, near 1/n when one token carries the batch;
- `clip_frac_pos`: of the positive-advantage tokens, the share past the clip's upper bound
  (w > 1 + clip_high: no gradient); `clip_frac_neg`: of the negative-advantage tokens, the share
  below its lower bound (w < 1 - clip_low);
- `neg_iw_over_c`: of the negative-advantage tokens, the share with w > c (`clip_c`, 3 when the
  loss has none): the tokens whose loss the PPO clip leaves unbounded, which dual clip caps;
- `clip_frac_turn0`, `clip_frac_turn1`, `clip_frac_turn2p`: clipped tokens (either sign) by the
  model turn they belong to (a turn: a run of scored tokens in a row; environment tokens between
  turns are not scored), so a first action clipped in stale episodes is not diluted by fresh turns.
A share whose tokens are absent is left out (not 0). `staleness_shares` is the batch's staleness
distribution by sample. `length_mix` is its mix of episode lengths (model turns: 1, 2, 3 or more)
and each length's mean staleness: with episodes one by one, long episodes finish last, so a batch
in finish order holds fewer of them than were admitted, and staler (issue 53, cause 1). The
explorers report the same mix over what they published (`published_turns_*`) to compare it with.
"""
from __future__ import annotations

import math

import torch

MAX_LOG_RATIO = 20.0
TURN_BUCKETS = ("turn0", "turn1", "turn2p")
LENGTH_BUCKETS = ("turns_1", "turns_2", "turns_3p")


def turn_index(mask: torch.Tensor) -> torch.Tensor:
    """Each scored token's turn in its row (0: the first run of scored tokens), -1 where unscored."""
    on = mask > 0
    starts = on & ~torch.nn.functional.pad(on[:, :-1], (1, 0), value=False)
    turns = torch.cumsum(starts.to(torch.long), dim=1) - 1
    return torch.where(on, turns, torch.full_like(turns, -1))


class OffPolicyStats:
    def __init__(self, clip_low: float = 0.2, clip_high: float = 0.2, clip_c: float | None = None):
        self.clip_low, self.clip_high = clip_low, clip_high
        self.c = 3.0 if clip_c is None else clip_c
        self.n = 0
        self.sum_w = self.sum_w2 = 0.0
        self.max_w = 0.0
        # name -> [hits, of]
        self.shares: dict[str, list[int]] = {k: [0, 0] for k in (
            "clip_frac_pos", "clip_frac_neg", "neg_iw_over_c", *(f"clip_frac_{b}" for b in TURN_BUCKETS))}

    @torch.no_grad()
    def add(self, logp: torch.Tensor, behaviour_logp: torch.Tensor, advantages: torch.Tensor,
            mask: torch.Tensor) -> None:
        """One micro-batch: `[B, T]` log-probs (current, behaviour), advantages `[B]` or `[B, T]`, mask."""
        on = mask > 0
        if not bool(on.any()):
            return
        log_w = torch.clamp(logp.detach().double() - behaviour_logp.double(), -MAX_LOG_RATIO, MAX_LOG_RATIO)
        w = torch.exp(log_w)
        adv = advantages.detach().double()
        adv = (adv.unsqueeze(-1) if adv.dim() == 1 else adv).expand_as(w)
        ws = w[on]
        self.n += int(ws.numel())
        self.sum_w += float(ws.sum())
        self.sum_w2 += float((ws * ws).sum())
        self.max_w = max(self.max_w, float(ws.max()))
        pos, neg = on & (adv > 0), on & (adv < 0)
        clipped = (pos & (w > 1 + self.clip_high)) | (neg & (w < 1 - self.clip_low))
        self._count("clip_frac_pos", clipped & pos, pos)
        self._count("clip_frac_neg", clipped & neg, neg)
        self._count("neg_iw_over_c", neg & (w > self.c), neg)
        turns = turn_index(mask)
        for i, bucket in enumerate(TURN_BUCKETS):
            in_turn = on & ((turns >= i) if i == len(TURN_BUCKETS) - 1 else (turns == i))
            self._count(f"clip_frac_{bucket}", clipped & in_turn, in_turn)

    def _count(self, name: str, hits: torch.Tensor, of: torch.Tensor) -> None:
        self.shares[name][0] += int(hits.sum())
        self.shares[name][1] += int(of.sum())

    def result(self) -> dict[str, float]:
        if not self.n:
            return {}
        out = {"iw_mean": self.sum_w / self.n, "iw_max": self.max_w,
               "iw_ess": self.sum_w ** 2 / (self.n * self.sum_w2) if self.sum_w2 > 0 else 1.0}
        out.update({k: hits / of for k, (hits, of) in self.shares.items() if of})
        return {k: v for k, v in out.items() if math.isfinite(v)}


def staleness_shares(staleness: list[int]) -> dict[str, float]:
    """The batch's samples by staleness (trainer version - the sample's model version): 0, 1, 2 or more."""
    n = len(staleness)
    if not n:
        return {}
    return {"staleness_0": sum(s <= 0 for s in staleness) / n, "staleness_1": sum(s == 1 for s in staleness) / n,
            "staleness_2p": sum(s >= 2 for s in staleness) / n}


def model_turns(mask: list[int]) -> int:
    """How many model turns an episode's loss mask (of 0s and 1s) holds: its runs of 1s (0 for none)."""
    b = bytes(mask)  # counted in C: explorers count every episode they publish
    return b.count(b"\x00\x01") + (b[:1] == b"\x01")


def length_bucket(turns: int) -> str:
    """`turns_1` (none or one), `turns_2`, `turns_3p`."""
    return LENGTH_BUCKETS[min(max(turns, 1), 3) - 1]


def length_mix(turns: list[int], staleness: list[int]) -> dict[str, float]:
    """The batch's samples by episode length (`turns_1` ...: shares) and each length's mean staleness
    (`staleness_turns_1` ...; a length the batch lacks is left out)."""
    n = len(turns)
    if not n:
        return {}
    out: dict[str, float] = {}
    for bucket in LENGTH_BUCKETS:
        ages = [s for t, s in zip(turns, staleness) if length_bucket(t) == bucket]
        out[bucket] = len(ages) / n
        if ages:
            out[f"staleness_{bucket}"] = sum(ages) / len(ages)
    return out
