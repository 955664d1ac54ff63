"""Advantages that cannot be computed inside one group, so the trainer computes them per batch.

Group-relative estimators (grpo, dr_grpo, rloo, opmd) run in stream ops and arrive on the
ExperienceGroup. These three need the batch or a model: REINFORCE++ whitens over the batch, PPO's
GAE needs a critic (trained here alongside the policy with the clipped value loss), on-policy
distillation needs a teacher's log-probs. `make_batch_advantage(cfg, ...)` returns None when the
stream-ops advantages are used as they are.

Step-wise data (one trajectory per model turn, every step with its episode's reward): REINFORCE++
without a KL penalty whitens each step's reward, which is the episode's, so every step of an
episode gets the same advantage, as the group estimators give it in stream ops (an episode of k
steps weighs k times in the batch mean and std). GAE, REINFORCE++ with a token-level KL penalty
and on-policy distillation are per-token estimators: each step is valued on its own tokens.
"""
from __future__ import annotations

import torch

from streamrft.config import RunConfig
from streamrft.consumers.batch import Batch, token_logprobs


class ValueModel(torch.nn.Module):
    """A critic: the policy's transformer body with a scalar head, V(s_t) for every position."""

    def __init__(self, path: str, dtype: str = "float32"):
        super().__init__()
        from transformers import AutoModelForCausalLM

        lm = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
        self.body = lm.base_model
        self.head = torch.nn.Linear(lm.config.hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, batch: Batch) -> torch.Tensor:
        hidden = self.body(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
        return self.head(hidden[:, :-1]).squeeze(-1).float()  # [B, L-1], aligned with Batch.mask


def outcome_token_rewards(batch: Batch) -> torch.Tensor:
    """The sequence reward placed on each sequence's last trained token, zero elsewhere."""
    rewards = torch.zeros_like(batch.mask)
    device = batch.mask.device
    last = (batch.mask * torch.arange(batch.mask.shape[1], device=device)).argmax(dim=1)
    rewards[torch.arange(len(batch), device=device), last] = batch.rewards
    return rewards


class ReinforcePP:
    def __init__(self, params: dict):
        self.params = params

    def __call__(self, batch: Batch, kl_penalty: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
        from streamrft.engine.algorithms import reinforce_pp

        if kl_penalty is None:
            return reinforce_pp(batch.rewards, **self.params), {}
        # token-level rewards: outcome on the last token minus the per-token KL penalty
        return reinforce_pp(outcome_token_rewards(batch) - kl_penalty, batch.mask, **self.params), {}


class GAECritic:
    """PPO with a value model: GAE advantages per token, critic updated once per batch."""

    def __init__(self, cfg: RunConfig, params: dict, device: str = "cpu"):
        self.gamma, self.lam = params.get("gamma", 1.0), params.get("lam", 1.0)
        self.vf_clip = params.get("vf_clip", 0.2)
        self.device = device
        self.critic = ValueModel(cfg.model.path, cfg.model.dtype).to(device)
        self.optimizer = torch.optim.AdamW(self.critic.parameters(), lr=params.get("critic_lr", cfg.trainer.lr))

    def __call__(self, batch: Batch, kl_penalty: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
        from streamrft.engine.algorithms import gae, value_loss

        self.critic.train()
        home, batch = batch.mask.device, batch.to(self.device)
        values = self.critic(batch)
        rewards = outcome_token_rewards(batch)
        if kl_penalty is not None:
            rewards = rewards - kl_penalty.to(self.device)
        advantages, returns = gae(rewards, values.detach(), batch.mask, self.gamma, self.lam)
        loss, metrics = value_loss(values, values.detach(), returns, batch.mask, clip=self.vf_clip)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.critic.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return advantages.detach().to(home), {"value_loss": float(loss.detach()), **metrics}

    def save(self, directory) -> None:
        torch.save({"critic": self.critic.state_dict(), "optimizer": self.optimizer.state_dict()}, directory / "critic.pt")

    def load(self, directory) -> None:
        state = torch.load(directory / "critic.pt", weights_only=True, map_location=self.device)
        self.critic.load_state_dict(state["critic"])
        self.optimizer.load_state_dict(state["optimizer"])


class TeacherOPD:
    """On-policy distillation: advantage_t = log p_teacher(y_t) - log p_behaviour(y_t)."""

    def __init__(self, cfg: RunConfig, params: dict, device: str = "cpu"):
        from streamrft.engine.models import load_policy

        path = params.get("teacher_path")
        if not path:
            raise ValueError("algorithm.advantage.params.teacher_path must name the teacher model for type 'opd'")
        self.teacher, _ = load_policy(path, dtype=cfg.model.dtype, device=device)
        self.device = device
        self.teacher.requires_grad_(False)
        self.temperature = cfg.explorer.sampling.temperature or 1.0

    @torch.no_grad()
    def __call__(self, batch: Batch, kl_penalty: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
        from streamrft.engine.algorithms import opd

        teacher, _ = token_logprobs(self.teacher, batch.to(self.device), self.temperature)
        teacher = teacher.to(batch.mask.device)
        adv = opd(teacher, batch.old_logprobs, batch.mask)
        return adv, {"teacher_student_logratio": float((adv * batch.mask).sum() / batch.mask.sum().clamp(min=1))}


def make_batch_advantage(cfg: RunConfig, device: str = "cpu"):
    """The trainer's batch-level advantage (None: stream ops computed group advantages); a critic or a
    teacher lives on `device` and hands its results back on the batch's device."""
    from streamrft.engine.algorithms import PRESETS

    name = cfg.algorithm.advantage.type or PRESETS[cfg.algorithm.type]["advantage"]
    params = dict(cfg.algorithm.advantage.params)
    if cfg.algorithm.advantage.import_path:
        return None  # a user's group-level function: stream ops applied it
    if name == "reinforce_pp":
        return ReinforcePP(params)
    if name == "gae":
        return GAECritic(cfg, params, device)
    if name == "opd":
        return TeacherOPD(cfg, params, device)
    return None
