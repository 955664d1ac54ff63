"""An environment token (loss_mask 0) never receives gradient, whatever the loss and aggregation.

Multi-turn rows interleave model tokens (mask 1) with environment and template tokens (mask 0,
behaviour log-prob 0.0); the gradient reaching the logits of a masked position must be exactly 0,
through the policy loss, the KL penalty and the entropy bonus alike.
"""

import pytest
import torch

from streamrft.engine.algorithms import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    entropy_from_logits,
    policy_objective,
)

# two multi-turn rows (model, env, model, ...) and one fully padded row
MASK = torch.tensor(
    [
        [1, 1, 0, 0, 1, 1, 0],
        [1, 0, 0, 1, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0],
    ],
    dtype=torch.float64,
)
B, T, V = MASK.shape[0], MASK.shape[1], 5


@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_masked_tokens_get_no_gradient(name, mode):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(B, T, V, generator=g, dtype=torch.float64, requires_grad=True)
    tokens = torch.randint(0, V, (B, T), generator=g)
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    noise = 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    # environment tokens carry behaviour log-prob 0.0, as the workflows write them
    old = torch.where(MASK > 0, logp.detach() + noise, torch.zeros_like(noise))
    ref = logp.detach() - 0.1
    advantages = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    params = {"prox_logprobs": logp.detach() + 0.05} if name == "decoupled_ppo" else {}
    loss, _ = policy_objective(
        logp, old, advantages, MASK, ref, entropy_from_logits(logits),
        loss_fn=POLICY_LOSSES[name], loss_params=params, kl_fn=KL_ESTIMATORS["k3"], kl_coef=0.1,
        entropy_coef=0.01, agg_mode=mode, norm_len=8,
    )
    loss.backward()
    grad = logits.grad
    assert torch.equal(grad[MASK == 0], torch.zeros_like(grad[MASK == 0]))
    assert grad[MASK > 0].abs().sum() > 0
