"""RL and preference-tuning algorithms as pure tensor functions, chosen by name from literal dicts.

The config names an entry (`resolve(POLICY_LOSSES, "ppo", None)`) or a user's own function
(`import_path="pkg.module:function"`). To add an algorithm, write the function in its module
and add one line to the table below; `PRESETS` maps each algorithm `type` to its parts.
"""

from __future__ import annotations

from .advantages import (
    broadcast_to_steps,
    dr_grpo,
    gae,
    grpo,
    opd,
    opmd,
    reinforce_pp,
    rloo,
)
from .aggregation import AGGREGATIONS, aggregate, masked_mean
from .kl import entropy_from_logits, k1, k2, k3, kl_penalty_rewards, low_var_kl
from .objective import policy_objective
from .offline import dpo_loss, dpo_metrics, kto_kl_ref, kto_loss, sequence_logps, sft_loss
from .policy_losses import cispo, decoupled_ppo, gspo, pg, ppo, sft
from .registry import resolve
from .value import value_loss

# Group-level (one group's rewards -> [n]): grpo, dr_grpo, rloo, opmd.
# Batch-level: reinforce_pp. Token-level: gae (needs values), opd (needs teacher log-probs).
ADVANTAGES = {
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "opmd": opmd,
    "reinforce_pp": reinforce_pp,
    "gae": gae,
    "opd": opd,
}

# fn(logprobs, old_logprobs, advantages, mask, **params) -> (scalar loss, metrics)
POLICY_LOSSES = {
    "ppo": ppo,
    "decoupled_ppo": decoupled_ppo,
    "gspo": gspo,
    "cispo": cispo,
    "pg": pg,
    "sft": sft,
}

# Per-example losses from sequence log-probs, with their own signatures (see offline.py).
OFFLINE_LOSSES = {
    "dpo": dpo_loss,
    "kto": kto_loss,
}

# fn(logprobs, ref_logprobs) -> per-token [B, T]
KL_ESTIMATORS = {
    "k1": k1,
    "k2": k2,
    "k3": k3,
    "low_var_kl": low_var_kl,
}

# algorithm type -> its parts. "policy_loss" is a POLICY_LOSSES key, except "dpo" and "kto",
# which are OFFLINE_LOSSES keys; "aggregation" is an AGGREGATIONS key.
PRESETS = {
    "grpo": {"advantage": "grpo", "policy_loss": "ppo", "aggregation": "token-mean"},
    "dr_grpo": {
        "advantage": "dr_grpo",
        "policy_loss": "ppo",
        "aggregation": "seq-mean-token-sum-norm",
    },
    "ppo": {"advantage": "gae", "policy_loss": "ppo", "aggregation": "token-mean"},
    "rloo": {"advantage": "rloo", "policy_loss": "ppo", "aggregation": "token-mean"},
    "reinforce_pp": {
        "advantage": "reinforce_pp",
        "policy_loss": "ppo",
        "aggregation": "token-mean",
    },
    "gspo": {"advantage": "grpo", "policy_loss": "gspo", "aggregation": "seq-mean-token-mean"},
    "cispo": {"advantage": "grpo", "policy_loss": "cispo", "aggregation": "token-mean"},
    "opd": {"advantage": "opd", "policy_loss": "ppo", "aggregation": "token-mean"},
    "sft": {"advantage": None, "policy_loss": "sft", "aggregation": "token-mean"},
    "dpo": {"advantage": None, "policy_loss": "dpo", "aggregation": "seq-mean-token-sum"},
    "kto": {"advantage": None, "policy_loss": "kto", "aggregation": "seq-mean-token-sum"},
}

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "OFFLINE_LOSSES",
    "POLICY_LOSSES",
    "PRESETS",
    "aggregate",
    "broadcast_to_steps",
    "dpo_metrics",
    "entropy_from_logits",
    "kl_penalty_rewards",
    "kto_kl_ref",
    "masked_mean",
    "policy_objective",
    "resolve",
    "sequence_logps",
    "sft_loss",
    "value_loss",
]
