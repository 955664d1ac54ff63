"""The optimiser side of the trainer: one batch of experiences in, one or more optimiser updates.

`Objective` resolves the config's algorithm once (policy loss, KL, entropy, aggregation, Dr.GRPO's
length normaliser). `UpdateLoop.train_step` collates a batch, computes batch-level advantages
(REINFORCE++, GAE, OPD) and a KL reward penalty when configured, then makes
`ppo_epochs x mini_batches` updates (decoupled PPO clips against the batch-start policy, its
log-probs computed once), each forward and backward by micro-batch. The `Trainer` (trainer.py)
mixes it in and owns the rest: Kafka, staleness and dedup, versions, checkpoints.

With DeepSpeed data parallelism (`world` > 1) every rank holds the whole batch and draws the same
mini-batches from it; of each update's rows (the batch's, or a mini-batch's) a rank trains on its
contiguous share (`rank_share`: sizes differ by at most one row, the first ranks' the larger).
Every rank makes the same forwards, backwards and optimiser steps, because ZeRO's gradient
reduce-scatter, ZeRO-3's parameter gathers and the step are collectives: a rank whose share is
empty (fewer rows than ranks) makes the update on one zero-weighted row instead (`padding_row`:
a real row with its loss mask zeroed, so every parameter gets a zero gradient and the loss gains
nothing). The loss is normalised by the counts of the update's rows on all ranks, so the update
is the one a single process makes on the same rows.
"""
from __future__ import annotations

import torch

from streamrft.config import RunConfig
from streamrft.consumers.batch import Batch, collate, micro_batches, token_logprobs
from streamrft.consumers.sft_mix import sft_loss
from streamrft.engine.algorithms.offpolicy import OffPolicyStats, length_mix, model_turns, staleness_shares
from streamrft.engine.precision import usable_autocast

CLIPPED_LOSSES = ("ppo", "decoupled_ppo")  # losses whose clip_low / clip_high are token ratio bounds


class Objective:
    """The config's algorithm, resolved once: a callable per micro-batch."""

    def __init__(self, cfg: RunConfig):
        from streamrft.engine.algorithms import KL_ESTIMATORS, POLICY_LOSSES, PRESETS, resolve

        algo = cfg.algorithm
        preset = PRESETS[algo.type]
        self.loss_name = algo.policy_loss.type or preset["policy_loss"]
        if self.loss_name not in POLICY_LOSSES and algo.policy_loss.import_path is None:
            raise ValueError(f"algorithm.type={algo.type!r} is trained offline (streamrft train with an offline "
                             f"data source), not by the online trainer")
        self.loss_fn = resolve(POLICY_LOSSES, self.loss_name, algo.policy_loss.import_path)
        self.loss_params = dict(algo.policy_loss.params)
        self.agg_mode = algo.aggregation or preset["aggregation"]
        self.kl_coef = algo.kl.coef if algo.kl.mode == "loss" else 0.0
        self.kl_fn = KL_ESTIMATORS[algo.kl.estimator] if self.kl_coef else None
        self.entropy_coef = algo.entropy_coef
        # Dr.GRPO's constant length: the most tokens the loss can sum in one trajectory, i.e. the model's
        # sampled (mask 1) tokens. single_turn and step_wise (one turn per trajectory): max_new_tokens.
        # multi_turn (and a user's workflow, which gets the same TurnLimits): max_turns turns of at most
        # max_new_tokens each, and prompt + response within max_total_tokens; environment tokens are masked
        # and never counted. Any constant keeps the objective unbiased; this one keeps the loss's scale.
        ex = cfg.explorer
        self.norm_len = ex.sampling.max_new_tokens
        if ex.workflow_import_path or ex.workflow == "multi_turn":
            self.norm_len = min(ex.max_turns * ex.sampling.max_new_tokens, ex.max_total_tokens)

    def offpolicy_stats(self) -> OffPolicyStats:
        """A step's off-policy diagnostics, with this loss's clip bounds (PPO's 0.2 for other losses)."""
        p = self.loss_params if self.loss_name in CLIPPED_LOSSES else {}
        return OffPolicyStats(p.get("clip_low", 0.2), p.get("clip_high", 0.2), p.get("clip_c"))

    def __call__(self, logp, batch: Batch, ref_logp, entropy, global_tokens, global_seqs, prox=None):
        from streamrft.engine.algorithms import policy_objective

        params = dict(self.loss_params)
        if self.loss_name == "decoupled_ppo":  # the policy at the start of the batch (one update: the current one)
            params["prox_logprobs"] = logp.detach() if prox is None else prox
        return policy_objective(logp, batch.old_logprobs, batch.advantages, batch.mask, ref_logp, entropy,
                                loss_fn=self.loss_fn, loss_params=params, kl_fn=self.kl_fn, kl_coef=self.kl_coef,
                                entropy_coef=self.entropy_coef, agg_mode=self.agg_mode, global_tokens=global_tokens,
                                global_seqs=global_seqs, norm_len=self.norm_len,
                                sample_weights=None if bool((batch.weights == 1).all()) else batch.weights)


def row_abs_advantages(batch: Batch) -> list[float]:
    """Each row's mean |advantage| over its scored tokens (group advantages: |advantage|)."""
    adv = batch.advantages.detach().float()
    if adv.dim() == 1:
        return adv.abs().tolist()
    mask = batch.mask[:, :adv.shape[1]].to(adv.device)
    return ((adv.abs() * mask).sum(1) / mask.sum(1).clamp(min=1)).tolist()


def rank_share(rows: int, world: int, rank: int) -> tuple[int, int]:
    """(start, stop) of `rank`'s contiguous share of `rows` rows: sizes differ by at most one, the
    first ranks take the extra rows (rank 0's share is the largest, -(-rows // world)); a rank
    past the rows gets an empty share."""
    base, extra = divmod(rows, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def padding_row(batch: Batch) -> Batch:
    """One real row of `batch` with its loss mask, advantage and reward zeroed: a rank with no rows
    of its own forwards and backwards it to join the collectives, contributing exactly zero."""
    row = batch.slice(0, 1)
    return Batch(row.input_ids, row.attention_mask, torch.zeros_like(row.mask), row.old_logprobs,
                 torch.zeros_like(row.advantages), torch.zeros_like(row.rewards), row.weights,
                 row.pixel_values, row.image_rows)


class UpdateLoop:
    """Mixed into `Trainer`, which sets: cfg, tc, model, ref_model, engine, objective,
    batch_advantage, reward_kl, tokenizer, device, world, state, update_metrics, and `sft`
    (a `consumers.sft_mix.SftSource` with `trainer.sft_mix`, else None)."""

    def train_step(self, samples: list[tuple], weights: list[float] | None = None) -> dict[str, float]:
        """One step on `samples` (trajectory, advantage, reward); `weights` per sample scale each row's
        gradient (prioritised replay's importance weights; None: all 1)."""
        batch = collate(samples, self.tokenizer.pad_token_id, weights, getattr(self, "pixels", None))
        temperature = self.cfg.explorer.sampling.temperature or 1.0
        global_tokens, global_seqs = batch.mask.sum(), (batch.mask.sum(1) > 0).sum()
        metrics: dict[str, float] = {}
        if self.batch_advantage is not None:
            penalty = None
            if self.reward_kl is not None:  # KL to the reference as a per-token reward penalty
                with torch.no_grad():
                    ref, _ = token_logprobs(self.ref_model, batch.to(self.device), temperature)
                kl = self.reward_kl(batch.old_logprobs, ref.to(batch.mask.device)) * batch.mask
                penalty = self.cfg.algorithm.kl.coef * kl
                metrics["reward_kl"] = float(kl.sum() / batch.mask.sum().clamp(min=1))
            batch.advantages, extra = self.batch_advantage(batch, penalty)
            metrics.update(extra)
        self.row_abs_advantages = row_abs_advantages(batch)  # the replay buffer's td_error priority
        sft = getattr(self, "sft", None)
        self._sft_step = None if sft is None else (sft.batch(self.state.step), sft.mu(self.state.step))
        self.model.train()
        device = next(self.model.parameters()).device
        amp = usable_autocast(device.type, self.tc.autocast)  # bf16 on a CPU without bf16 kernels: float32
        autocast = torch.autocast(device.type, dtype=getattr(torch, amp or "float32"), enabled=amp is not None)
        updates = self.tc.ppo_epochs * self.tc.mini_batches
        # decoupled PPO clips against the proximal policy: the weights at the start of this batch,
        # their log-probs computed once (with one update per batch they equal the current ones)
        prox = self._logprobs(batch, temperature, autocast, device) if updates > 1 and \
            self.objective.loss_name == "decoupled_ppo" else None
        bound = self.tc.max_update_kl
        if bound is not None:  # the batch-start policy: its log-probs and weights, for the step's trust region
            start = prox if prox is not None else self._logprobs(batch, temperature, autocast, device)
            before = [p.detach().clone() for p in self.engine.params]
        pad = padding_row(batch) if self.world > 1 else None
        order = torch.Generator().manual_seed(self.tc.seed * 1_000_003 + self.state.step)  # the same on every rank
        self.update_metrics = []
        self._offpolicy = self.objective.offpolicy_stats()  # over every update of this step (`_update`)
        for _ in range(self.tc.ppo_epochs):
            rows = torch.randperm(len(batch), generator=order).tolist() if self.tc.mini_batches > 1 \
                else list(range(len(batch)))
            for k in range(self.tc.mini_batches):
                mini_rows = rows[k::self.tc.mini_batches]
                if not mini_rows:
                    continue  # a mini-batch beyond the batch: skipped on every rank alike
                mask = batch.mask[mini_rows]  # one update: the whole batch; several: this mini-batch
                counts = (global_tokens, global_seqs) if updates == 1 else (mask.sum(), (mask.sum(1) > 0).sum())
                if pad is not None:  # this rank's contiguous share of the update's rows
                    start, stop = rank_share(len(mini_rows), self.world, self.engine.rank)
                    mini_rows = mini_rows[start:stop]
                if mini_rows:
                    self.update_metrics.append(self._update(batch, mini_rows, prox, temperature, autocast, device,
                                                            counts))
                else:  # no rows here, some on other ranks: join the update's collectives on a zero-weight row
                    self.update_metrics.append(self._update(pad, [0], None, temperature, autocast, device, counts))
        for key in {k for m in self.update_metrics for k in m}:  # means over the updates
            values = [m[key] for m in self.update_metrics if key in m]
            metrics[key] = sum(values) / len(values)
        metrics["updates"] = float(len(self.update_metrics))
        if bound is not None:
            metrics.update(self._trust_region(batch, start, before, bound, temperature, autocast, device))
        if self._sft_step is not None:
            rows = len(batch) + len(self._sft_step[0].input_ids)
            metrics.update(chord_mu=self._sft_step[1], share_sft=len(self._sft_step[0].input_ids) / rows,
                           share_rl=len(batch) / rows)
        staleness = [self.state.version - t.model_version for t, _, _ in samples]
        metrics.update(reward_mean=float(batch.rewards.mean()), staleness_mean=sum(staleness) / len(staleness),
                       staleness_max=float(max(staleness)), samples=float(len(batch)),
                       response_len=float(batch.mask.sum() / len(batch)),
                       **staleness_shares(staleness), **self._offpolicy.result(),
                       **length_mix([model_turns(t.mask()) for t, _, _ in samples], staleness))
        return metrics

    def _trust_region(self, batch: Batch, start: torch.Tensor, before: list[torch.Tensor], bound: float,
                      temperature: float, autocast, device) -> dict[str, float]:
        """Scale this step back until the KL from the batch-start policy is within `bound`
        (`engine/algorithms/trust_region.py`); undone after `MAX_SCALE_BACKS` tries. Metrics: the
        step's KL as taken (`update_kl`) and as kept (`update_kl_kept`), and the scale kept."""
        from streamrft.engine.algorithms.trust_region import MAX_SCALE_BACKS, next_scale, set_scale, step_kl

        def kl() -> float:
            return step_kl(start, self._logprobs(batch, temperature, autocast, device), batch.mask)

        taken = kept = kl()
        scale = 1.0
        if taken > bound:
            params = self.engine.params
            after = [p.detach().clone() for p in params]
            for _ in range(MAX_SCALE_BACKS):
                scale = next_scale(scale, kept, bound)
                set_scale(params, before, after, scale)
                kept = kl()
                if kept <= bound:
                    break
            else:
                scale, kept = 0.0, 0.0
                set_scale(params, before, after, 0.0)
        return {"update_kl": taken, "update_kl_kept": kept, "update_scale": scale}

    def _logprobs(self, batch: Batch, temperature: float, autocast, device) -> torch.Tensor:
        """The current policy's log-probs of every row of `batch`, without gradients, by micro-batch.
        DeepSpeed: the whole batch in one forward on every rank (a rank's shares of the mini-batches
        may be any rows; ZeRO-3 gathers the weights in each forward, so every rank makes as many)."""
        out = torch.zeros_like(batch.old_logprobs)
        if self.world > 1:
            parts = [list(range(len(batch)))]
        else:
            parts = micro_batches(batch.attention_mask.sum(1).tolist(), self.tc.micro_batch_size,
                                  self.tc.micro_batch_tokens)
        with torch.no_grad():
            for rows in parts:
                with autocast:
                    logp, _ = token_logprobs(self.model, batch.select(rows).to(device), temperature)
                out[rows, :logp.shape[1]] = logp.to(out.device)  # select() dropped trailing padding columns
        return out

    def _update(self, batch: Batch, rows: list[int], prox: torch.Tensor | None, temperature: float, autocast,
                device, counts: tuple) -> dict[str, float]:
        """One optimiser update on `rows` of `batch` (the whole batch, or one mini-batch of one epoch;
        with DeepSpeed this rank's share of it): forward and backward by micro-batch, then the step.
        The loss is normalised by `counts`: the tokens and sequences of the update's rows on every
        rank (the whole batch's, or the whole mini-batch's)."""
        mini = batch.select(rows)
        tokens, seqs = counts
        if self.world > 1:  # DeepSpeed: one backward per step
            parts = [list(range(len(mini)))]
        else:
            parts = micro_batches(mini.attention_mask.sum(1).tolist(), self.tc.micro_batch_size,
                                  self.tc.micro_batch_tokens)
        metrics: dict[str, float] = {}
        for part_rows in parts:
            part = mini.select(part_rows).to(device)
            with autocast:  # the model's matmuls; token_logprobs hands back float32
                logp, entropy = token_logprobs(self.model, part, temperature,
                                               with_entropy=self.objective.entropy_coef != 0)
                ref = None
                if self.objective.kl_fn is not None:
                    with torch.no_grad():
                        ref, _ = token_logprobs(self.ref_model, part, temperature)
            # prox spans `batch`'s columns; select() cut this part to its longest row
            part_prox = None if prox is None else prox[[rows[i] for i in part_rows], :part.mask.shape[1]].to(device)
            loss, m = self.objective(logp, part, ref, entropy, tokens, seqs, prox=part_prox)
            self._offpolicy.add(logp, part.old_logprobs, part.advantages, part.mask)
            if self._sft_step is not None:  # CHORD: (1 - mu) * RL loss + mu * SFT loss
                loss = (1 - self._sft_step[1]) * loss
            self.engine.backward(loss)
            for k, v in m.items():  # loss terms add up over micro-batches; the rest by share of rows
                metrics[k] = metrics.get(k, 0.0) + float(v) * (1.0 if k in ("loss", "policy_loss") else len(part) / len(mini))
        if self._sft_step is not None:
            expert, mu = self._sft_step
            with autocast:
                logp, _ = token_logprobs(self.model, expert.to(device), 1.0)
            term = sft_loss(logp, expert.mask.to(device), self.tc.sft_mix.phi)
            self.engine.backward(mu * term)
            metrics["sft_loss"] = float(term.detach())
        metrics["grad_norm"] = self.engine.step()
        metrics["lr"] = self.engine.last_lr
        return metrics
