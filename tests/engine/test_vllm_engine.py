"""VLLMEngine against the same tiny model as the transformers engine (GPU and vllm only)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def vllm_setup(tmp_path_factory):
    torch = pytest.importorskip("torch")
    pytest.importorskip("vllm")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from streamrft.engine.models import build_char_tokenizer, build_tiny_model
    from streamrft.engine.rollout.vllm_engine import VLLMEngine
    from streamrft.producers.synthetic import ALPHABET

    path = tmp_path_factory.mktemp("tiny_vllm")
    # head_dim 64: a size every vLLM attention backend supports
    build_tiny_model(path, build_char_tokenizer(ALPHABET), hidden_size=128, layers=2, heads=2, seed=0)
    engine = VLLMEngine(str(path), dtype="float32", gpu_memory_utilization=0.2, max_model_len=128, enforce_eager=True)
    return engine, path


def test_vllm_n_completions_and_logprobs_match_hf(vllm_setup):
    import torch

    from streamrft.engine.models import load_policy
    from streamrft.engine.rollout import SamplingParams

    engine, path = vllm_setup
    model, tok = load_policy(path)
    prompts = [tok("rev abc=").input_ids, tok("rev hgfedc=").input_ids]
    out = engine.generate(prompts, SamplingParams(n=3, max_new_tokens=6, temperature=0.8, seed=1))
    assert [len(g) for g in out] == [3, 3]
    for prompt, group in zip(prompts, out):
        for c in group:
            assert len(c.token_ids) == len(c.logprobs) >= 1
            seq = torch.tensor([prompt + c.token_ids])
            with torch.no_grad():
                logits = model(seq).logits[0, len(prompt) - 1 : -1] / 0.8
            expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
            assert torch.allclose(torch.tensor(c.logprobs), expected, atol=2e-3)


def test_vllm_load_weights_changes_outputs(vllm_setup):
    import torch

    from streamrft.engine.models import load_policy, state_dict_to_cpu
    from streamrft.engine.rollout import SamplingParams

    engine, path = vllm_setup
    model, tok = load_policy(path)
    prompts = [tok("rev abc=").input_ids]
    greedy = SamplingParams(n=1, max_new_tokens=6, temperature=0)
    before = engine.generate(prompts, greedy)
    gen = torch.Generator().manual_seed(0)
    new = {k: v + 0.5 * torch.randn(v.shape, generator=gen) for k, v in state_dict_to_cpu(model).items()}
    engine.load_weights(new, version=2)
    after = engine.generate(prompts, greedy)
    assert engine.version == 2
    assert before[0][0].logprobs != after[0][0].logprobs


def test_vllm_serves_a_lora_version_as_the_merged_model_computes_it(vllm_setup):
    """A LoRA version becomes a LoRARequest on the base; its log-probs are the merged model's."""
    import torch

    from streamrft.config import LoraSpec, TrainerConfig
    from streamrft.engine.models import load_policy
    from streamrft.engine.rollout import SamplingParams
    from streamrft.engine.rollout.hf import TransformersEngine
    from streamrft.engine.rollout.vllm_engine import VLLMEngine
    from streamrft.engine.training.torch_engine import TorchTrainEngine

    _, path = vllm_setup
    lora = LoraSpec(r=8, alpha=16)
    model, tok = load_policy(path)
    trainer = TorchTrainEngine(model, TrainerConfig(lr=0.05), lora)
    ids = torch.tensor([tok("rev abc=cba").input_ids])
    for _ in range(3):
        trainer.backward(trainer.model(input_ids=ids, labels=ids).loss)
        trainer.step()
    adapter = {k: v.detach().clone() for k, v in trainer.publishable_state_dict().items()}
    engine = VLLMEngine(str(path), dtype="bfloat16", gpu_memory_utilization=0.2, max_model_len=128,
                        enforce_eager=True, lora=lora)
    merged = TransformersEngine(str(path))
    merged.load_weights(adapter, 1, lora)
    engine.load_weights(adapter, 1, lora)
    assert engine.version == 1 and engine.lora_request is not None
    prompt = tok("rev abc=").input_ids
    out = engine.generate([prompt], SamplingParams(n=1, max_new_tokens=6, temperature=0))[0][0]
    seq = torch.tensor([prompt + out.token_ids])
    with torch.no_grad():
        logits = merged.model(seq).logits[0, len(prompt) - 1 : -1]
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(out.token_ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(out.logprobs), expected, atol=0.15)  # bfloat16 vs float32
