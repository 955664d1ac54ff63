"""VLLMEngine's LoRA request path and its close() (GPU and vllm only). Each test builds its own
engine and closes it: one in-process vLLM engine at a time (closing one tears down vLLM's
process-wide distributed state)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture
def tiny_model(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("vllm")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from streamrft.engine.models import build_char_tokenizer, build_tiny_model
    from streamrft.producers.synthetic import ALPHABET

    build_tiny_model(tmp_path, build_char_tokenizer(ALPHABET), hidden_size=128, layers=2, heads=2, seed=0)
    return tmp_path


def _adapter_after(trainer, ids, steps):
    for _ in range(steps):
        trainer.backward(trainer.model(input_ids=ids, labels=ids).loss)
        trainer.step()
    return {k: v.detach().clone() for k, v in trainer.publishable_state_dict().items()}


def test_vllm_serves_each_lora_version_as_the_merged_model_computes_it(tiny_model):
    """Each LoRA version becomes a LoRARequest (a new id) on the base; its log-probs are those of
    the base with that version merged, the second version's too (not the first one's, cached)."""
    import torch

    from streamrft.config import LoraSpec, TrainerConfig
    from streamrft.engine.models import load_policy, state_dict_to_cpu
    from streamrft.engine.rollout import SamplingParams
    from streamrft.engine.rollout.hf import TransformersEngine
    from streamrft.engine.rollout.vllm_engine import VLLMEngine
    from streamrft.engine.training.torch_engine import TorchTrainEngine

    lora = LoraSpec(r=8, alpha=16)
    model, tok = load_policy(tiny_model)
    trainer = TorchTrainEngine(model, TrainerConfig(lr=0.05), lora)
    ids = torch.tensor([tok("rev abc=cba").input_ids])
    engine = VLLMEngine(str(tiny_model), dtype="bfloat16", gpu_memory_utilization=0.2, kv_cache_gib=0.25,
                        max_model_len=128, enforce_eager=True, lora=lora)
    try:
        merged = TransformersEngine(str(tiny_model))
        prompt = tok("rev abc=").input_ids
        requests = []
        for version, steps in ((1, 3), (2, 6)):
            adapter = _adapter_after(trainer, ids, steps)
            merged.load_weights(adapter, version, lora)
            engine.load_weights(adapter, version, lora)
            assert engine.version == version and engine.lora_request is not None
            requests.append(engine.lora_request.lora_int_id)
            out = engine.generate([prompt], SamplingParams(n=1, max_new_tokens=6, temperature=0))[0][0]
            seq = torch.tensor([prompt + out.token_ids])
            with torch.no_grad():
                logits = merged.model(seq).logits[0, len(prompt) - 1:-1]
            expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(out.token_ids)[:, None])[:, 0]
            assert torch.allclose(torch.tensor(out.logprobs), expected, atol=0.15)  # bfloat16 vs float32
        assert requests[0] != requests[1]
        # vLLM 0.27 cannot load full weights through its LoRA layers: refused before it is asked
        with pytest.raises(RuntimeError, match="engine built for LoRA"):
            engine.load_weights(state_dict_to_cpu(load_policy(tiny_model)[0]), 3)
    finally:
        engine.close()


def test_vllm_close_gives_the_gpu_memory_back(tiny_model):
    """What final_eval relies on: the launcher's start eval frees its share before the roles start."""
    import torch

    from streamrft.engine.rollout import SamplingParams
    from streamrft.engine.rollout.vllm_engine import VLLMEngine

    kv_gib = 2.0
    engine = VLLMEngine(str(tiny_model), dtype="float32", gpu_memory_utilization=0.2, kv_cache_gib=kv_gib,
                        max_model_len=128, enforce_eager=True)
    try:
        assert engine.generate([[1, 2, 3]], SamplingParams(n=2, max_new_tokens=4))[0]
        built = torch.cuda.mem_get_info()[0]
    finally:
        engine.close()
    engine.close()  # a second close does nothing
    freed = torch.cuda.mem_get_info()[0] - built
    assert freed >= 0.9 * kv_gib * 2**30, f"close() gave back {freed / 2**30:.2f} GiB of a {kv_gib} GiB KV cache"
