"""A discrete-event model of the loop: explorers, admission, the bus, the trainer, weight versions.

    .venv/bin/python benchmarks/loop_model.py [--seconds 3600] [--set KEY=VALUE ...]   # one configuration
    .venv/bin/python benchmarks/loop_model.py --table                                # clusters (extrapolated)

What it models (each a parameter of `LoopParams`):
- `explorers` explorers, each generating up to `concurrency` groups at once; one group takes a
  random time (`gen_dist`: constant, exponential, or lognormal with mean `gen_s` and `gen_sigma`:
  heavy-tailed response lengths), at most `gen_cap` x `gen_s` (the length cap, max_new_tokens);
- admission (`producers/admission.py`, AReaL's rule): an explorer whose loaded version is v starts
  a group only while all explorers together have generated fewer than (v + S + 1) x B groups plus
  those dropped (S = `max_staleness`, B = `batch_groups`; None: no bound), v lowered to the oldest
  weights of any group still being generated (the newer groups will overtake it);
- the bus: a finished group reaches the trainer `bus_s` later; a share `filtered` of the groups is
  dropped on the way (zero variance) and frees its place;
- the trainer: once B groups are there it takes the B oldest (by their weights), trains for
  `step_s` (constant or exponential), publishes for `publish_s`: version + 1; a group older than
  S versions is dropped stale; explorers load the new version `load_s` after it is published.

It reports throughput, the trainer's idle share (waiting for a batch), the explorers' admission
wait, and the staleness of trained groups (version trained at minus version generated with).
Tests: `tests/test_loop_model.py` (a deterministic pipeline and M/M/1, against their closed forms).
Its figures for clusters are extrapolations from assumed rates, printed as such: docs/scaling.md.
"""
from __future__ import annotations

import argparse
import heapq
import math
import random
from collections import Counter
from dataclasses import dataclass, field, fields, replace


@dataclass
class LoopParams:
    explorers: int = 2
    concurrency: int = 1
    group_size: int = 8
    batch_groups: int = 8
    max_staleness: int | None = 2
    gen_s: float = 1.0
    gen_dist: str = "lognormal"  # constant | exponential | lognormal
    gen_sigma: float = 1.0
    gen_cap: float | None = None  # a group's latency at most this x `gen_s` (max_new_tokens); None: no cap
    bus_s: float = 0.05
    filtered: float = 0.0
    step_s: float = 1.0
    step_dist: str = "constant"  # constant | exponential
    publish_s: float = 0.0
    load_s: float = 0.0


@dataclass
class LoopStats:
    seconds: float
    versions: int
    groups_trained: int
    groups_generated: int
    dropped_filtered: int
    dropped_stale: int
    trainer_idle_s: float
    slot_busy_s: float  # summed over the explorers' `concurrency` slots: time generating
    staleness: Counter = field(default_factory=Counter)

    @property
    def groups_per_s(self) -> float:
        return self.groups_trained / self.seconds

    def explorer_idle(self, p: LoopParams) -> float:
        """The explorers' slots' share of time not generating (held back by admission)."""
        return 1 - self.slot_busy_s / (self.seconds * p.explorers * p.concurrency)

    @property
    def trainer_idle(self) -> float:
        return self.trainer_idle_s / self.seconds

    @property
    def mean_staleness(self) -> float:
        n = sum(self.staleness.values())
        return sum(k * v for k, v in self.staleness.items()) / n if n else 0.0

    def staleness_quantile(self, q: float) -> int:
        n, seen = sum(self.staleness.values()), 0
        for k in sorted(self.staleness):
            seen += self.staleness[k]
            if seen >= q * n:
                return k
        return 0


def _draw(rng: random.Random, dist: str, mean: float, sigma: float = 1.0) -> float:
    if dist == "constant" or mean == 0:
        return mean
    if dist == "exponential":
        return rng.expovariate(1.0 / mean)
    if dist == "lognormal":  # mean exp(mu + sigma^2 / 2) = `mean`
        return rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)
    raise ValueError(f"distribution {dist!r}: constant, exponential or lognormal")


def simulate(p: LoopParams, seconds: float, seed: int = 0, warmup_s: float = 0.0) -> LoopStats:
    """Run the loop for `seconds` of simulated time; statistics count from `warmup_s` on."""
    rng = random.Random(seed)
    events: list = []  # (time, order, kind, data)
    order = 0

    def at(t: float, kind: str, data=None) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (t, order, kind, data))

    version = 0  # the trainer's
    loaded = [0] * p.explorers  # each explorer's
    busy = [0] * p.explorers  # groups it is generating
    generated = dropped = 0
    in_flight: Counter = Counter()  # groups being generated, by the weights version they use
    queue: list[tuple[int, int]] = []  # groups at the trainer: (weights version, order), a heap
    training = False
    idle_since: float | None = 0.0
    s = LoopStats(seconds - warmup_s, 0, 0, 0, 0, 0, 0.0, 0.0)

    def counted(t0: float, t1: float) -> float:
        return max(0.0, min(t1, seconds) - max(t0, warmup_s))

    def admit(e: int, now: float) -> None:
        nonlocal generated
        while busy[e] < p.concurrency:
            # the bound is that of the oldest weights still generating: their groups are overtaken
            oldest = min(loaded[e], min(in_flight, default=loaded[e]))
            if p.max_staleness is not None and generated - dropped >= (oldest + p.max_staleness + 1) * p.batch_groups:
                return
            busy[e] += 1
            generated += 1
            in_flight[loaded[e]] += 1
            if now >= warmup_s:
                s.groups_generated += 1
            took = _draw(rng, p.gen_dist, p.gen_s, p.gen_sigma)
            if p.gen_cap is not None:
                took = min(took, p.gen_cap * p.gen_s)
            s.slot_busy_s += counted(now, now + took)
            at(now + took, "generated", (e, loaded[e]))

    def start_step(now: float) -> None:
        nonlocal training, idle_since, dropped
        batch = []
        while queue and len(batch) < p.batch_groups:
            v, _ = heapq.heappop(queue)
            if p.max_staleness is not None and version - v > p.max_staleness:
                dropped += 1
                s.dropped_stale += now >= warmup_s
                continue
            batch.append(v)
        if len(batch) < p.batch_groups:  # not enough fresh ones: back they go
            for v in batch:
                heapq.heappush(queue, (v, 0))
            for e in range(p.explorers):  # stale drops freed places
                admit(e, now)
            return
        if idle_since is not None:
            s.trainer_idle_s += counted(idle_since, now)
            idle_since = None
        training = True
        if now >= warmup_s:
            s.groups_trained += len(batch)
            for v in batch:
                s.staleness[version - v] += 1
        at(now + _draw(rng, p.step_dist, p.step_s) + p.publish_s, "published")

    for e in range(p.explorers):
        admit(e, 0.0)
    while events:
        now, _, kind, data = heapq.heappop(events)
        if now > seconds:
            break
        if kind == "generated":
            e, v = data
            busy[e] -= 1
            in_flight[v] -= 1
            if not in_flight[v]:
                del in_flight[v]
            at(now + p.bus_s, "arrived", v)
            # the oldest weights in flight may be newer now: the bound rose for every explorer
            for x in range(p.explorers) if not in_flight or v < min(in_flight) else [e]:
                admit(x, now)
        elif kind == "arrived":
            if rng.random() < p.filtered:
                dropped += 1
                s.dropped_filtered += now >= warmup_s
                for e in range(p.explorers):
                    admit(e, now)
            else:
                heapq.heappush(queue, (data, order))
                if not training:
                    start_step(now)
        elif kind == "published":
            version += 1
            s.versions += now >= warmup_s
            training = False
            idle_since = now
            at(now + p.load_s, "loaded", version)
            start_step(now)
        elif kind == "loaded":
            for e in range(p.explorers):
                loaded[e] = max(loaded[e], data)
                admit(e, now)
    if idle_since is not None:
        s.trainer_idle_s += counted(idle_since, seconds)
    return s


# ---- clusters: extrapolated from ASSUMED rates, not measured here ----

# generation tokens/s per GPU (vLLM, bf16, batched) and training tokens/s per GPU (FSDP/ZeRO, with
# the recomputed log-probs): ASSUMPTIONS from public reports of the peers' setups, order of magnitude
ASSUMED = {"1.5B": {"gen": 20_000, "train": 12_000, "bytes": 3.1e9},
           "7B": {"gen": 6_000, "train": 3_000, "bytes": 15.2e9},
           "32B": {"gen": 1_500, "train": 600, "bytes": 65.5e9}}
TOKENS = 2_000  # mean tokens a trajectory (prompt + response), lognormal sigma 1 capped at 4x: a heavy tail
BYTES_PER_TOKEN = 16  # on the bus: id, log-prob, mask, version, JSON framing (measured order here)
GROUPS_PER_WORKER_S = 600  # one faust stream-ops worker (issue 30: 590-800 groups/s measured)


def cluster_row(gpus: int, size: str, gen_share: float, staleness: int, seconds: float = 1800) -> dict:
    """One row of the cluster table: `gen_share` of the GPUs generate (one explorer each, 32 groups
    at once), the rest train; a step takes 16 groups (128 trajectories) per 8 GPUs."""
    a = ASSUMED[size]
    gen_gpus = max(1, round(gpus * gen_share))
    train_gpus = max(1, gpus - gen_gpus)
    group, batch, concurrency = 8, 2 * gpus, 32
    # a group's latency when a GPU generates `concurrency` groups at once, sharing its rate
    gen_s = concurrency * group * TOKENS / a["gen"]
    p = LoopParams(explorers=gen_gpus, concurrency=concurrency, group_size=group, batch_groups=batch,
                   max_staleness=staleness, gen_s=gen_s, gen_dist="lognormal", gen_sigma=1.0, gen_cap=4.0, bus_s=0.2,
                   filtered=0.3, step_s=batch * group * TOKENS / (a["train"] * train_gpus),
                   publish_s=a["bytes"] / 2e9, load_s=a["bytes"] / 1e9)
    st = simulate(p, seconds, seed=1, warmup_s=seconds / 10)
    traj_s = st.groups_per_s * group
    return {"gpus": gpus, "model": size, "gen:train": f"{gen_gpus}:{train_gpus}", "S": staleness,
            "traj/s": traj_s, "trainer idle": st.trainer_idle, "gen idle": st.explorer_idle(p),
            "staleness mean": st.mean_staleness, "p99": st.staleness_quantile(0.99),
            "bus MB/s": traj_s * TOKENS * BYTES_PER_TOKEN / 1e6,
            "S3 GB/s": gen_gpus * a["bytes"] * st.versions / st.seconds / 1e9,
            "workers": max(1, math.ceil(traj_s / group / GROUPS_PER_WORKER_S))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--table", action="store_true", help="the cluster table (extrapolated from ASSUMED rates)")
    a = ap.parse_args()
    if a.table:
        print("EXTRAPOLATED from assumed per-GPU rates (loop_model.ASSUMED), not measured:")
        cols = ["gpus", "model", "gen:train", "S", "traj/s", "trainer idle", "gen idle", "staleness mean", "p99",
                "bus MB/s", "S3 GB/s", "workers"]
        print("  ".join(f"{c:>9}" for c in cols))
        for gpus in (8, 64, 512):
            for size in ASSUMED:
                for share in (0.5, 0.75):
                    for staleness in (1, 2, 4, 8):
                        r = cluster_row(gpus, size, share, staleness)
                        print("  ".join(f"{r[c]:>9.2f}" if isinstance(r[c], float) else f"{r[c]!s:>9}" for c in cols))
        return
    types = {f.name: f.type for f in fields(LoopParams)}
    p = LoopParams()
    for kv in a.set:
        k, v = kv.split("=", 1)
        if k not in types:
            raise SystemExit(f"--set {k}: not one of {sorted(types)}")
        p = replace(p, **{k: None if v == "none" else (v if "str" in str(types[k]) and not v[0].isdigit()
                                                      else (float(v) if "float" in str(types[k]) else int(v)))})
    st = simulate(p, a.seconds, a.seed, warmup_s=a.seconds / 10)
    print(p)
    print(f"groups/s {st.groups_per_s:.3f}  trajectories/s {st.groups_per_s * p.group_size:.2f}  "
          f"versions {st.versions}  trainer idle {st.trainer_idle:.1%}  explorer slots idle "
          f"{st.explorer_idle(p):.1%}  staleness mean "
          f"{st.mean_staleness:.2f} p50 {st.staleness_quantile(0.5)} p99 {st.staleness_quantile(0.99)}  "
          f"dropped stale {st.dropped_stale} filtered {st.dropped_filtered}")


if __name__ == "__main__":
    main()
