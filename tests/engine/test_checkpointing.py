"""`trainer.gradient_checkpointing`: the same log-probs and gradients as without, less kept for backward,
the model left in eval mode (no dropout), and a clear error for a model without decoder layers."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from streamrft.consumers.batch import Batch, token_logprobs
from streamrft.engine.training import enable_checkpointing, make_train_engine


def _model(dropout: float = 0.0) -> Qwen2ForCausalLM:
    cfg = Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, attention_dropout=dropout)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).eval()


def _logprobs_and_grads(model) -> tuple[torch.Tensor, list[torch.Tensor], int]:
    torch.manual_seed(1)
    ids = torch.randint(0, 50, (2, 12))
    batch = Batch(ids, torch.ones(2, 12, dtype=torch.long), torch.ones(2, 11), torch.zeros(2, 11), torch.ones(2),
                  torch.ones(2), torch.ones(2))
    kept = {}

    def pack(t):
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp, _ = token_logprobs(model, batch)
        logp.sum().backward()
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return logp.detach(), [p.grad.clone() for p in model.parameters()], sum(n for k, n in kept.items() if k not in weights)


def test_checkpointed_layers_give_the_same_logprobs_and_gradients_keeping_less():
    plain, checkpointed = _model(dropout=0.5), _model(dropout=0.5)  # dropout set: eval mode must keep it off
    assert enable_checkpointing(checkpointed) == 3  # the three decoder layers
    assert not checkpointed.training and not any(m.training for m in checkpointed.modules()
                                                 if isinstance(m, torch.nn.Dropout))
    a, b = _logprobs_and_grads(plain), _logprobs_and_grads(checkpointed)
    assert torch.equal(a[0], b[0])
    assert max((x - y).abs().max().item() for x, y in zip(a[1], b[1])) <= 1e-6
    assert b[2] < a[2] / 3  # what stays saved for backward: each layer's input, not its insides


def test_the_trainer_setting_turns_it_on_and_a_model_without_layers_is_refused():
    from streamrft.config import TrainerConfig

    model = _model()
    engine = make_train_engine(TrainerConfig(gradient_checkpointing=True), copy.deepcopy(model))
    assert engine.model.is_gradient_checkpointing and engine.model.config.use_cache is False
    with pytest.raises(ValueError, match="gradient_checkpointing"):
        make_train_engine(TrainerConfig(gradient_checkpointing=True), torch.nn.Linear(2, 2))
