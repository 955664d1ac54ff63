"""VLLMEngine against the same tiny model as the transformers engine (GPU and vllm only:
`pip install -e ".[gpu,dev]" && pytest -m gpu`). Every log-prob vLLM records is checked against a
teacher-forced recomputation by transformers on the CPU, in float32.

The model's generation_config.json sets repetition_penalty, top_k, top_p, temperature and
max_new_tokens, all of which would change what is sampled: the engine must ignore every one of them.
The weight-reload test comes last: it changes the module's engine for good.
"""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.gpu

CHECKPOINT_SAMPLING = {"repetition_penalty": 1.8, "top_k": 2, "top_p": 0.5, "temperature": 0.1, "max_new_tokens": 2,
                       "do_sample": True}


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
    config_file = path / "generation_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **CHECKPOINT_SAMPLING}))
    engine = VLLMEngine(str(path), dtype="float32", gpu_memory_utilization=0.2, kv_cache_gib=0.25,
                        max_model_len=128, enforce_eager=True)
    yield engine, path
    engine.close()


def _teacher_logprobs(model, prompt, ids, temperature=1.0, top_k=0):
    """log-softmax of the CPU model's logits at each generated position: [len(ids), vocab]."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float()
    if temperature:
        logits = logits / temperature
    if top_k:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.log_softmax(logits, -1)


def _prompts(path):
    from streamrft.engine.models import load_policy

    model, tok = load_policy(path)
    return model, [tok("rev abc=").input_ids, tok("rev hgfedc=").input_ids]


def test_vllm_logprobs_are_those_sampled_from_not_the_checkpoints_generation_config(vllm_setup):
    import torch

    from streamrft.engine.rollout import SamplingParams

    engine, path = vllm_setup
    model, prompts = _prompts(path)
    out = engine.generate(prompts, SamplingParams(n=3, max_new_tokens=6, temperature=0.8, seed=1))
    assert [len(g) for g in out] == [3, 3]
    # the checkpoint's max_new_tokens=2 is not a limit either
    assert max(len(c.token_ids) for g in out for c in g) == 6
    for prompt, group in zip(prompts, out):
        for c in group:
            assert len(c.token_ids) == len(c.logprobs) >= 1 and c.top_logprobs is None
            assert c.finish_reason == ("stop" if c.token_ids[-1] == engine.tokenizer.eos_token_id else "length")
            expected = _teacher_logprobs(model, prompt, c.token_ids, 0.8).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
            assert torch.allclose(torch.tensor(c.logprobs), expected, atol=2e-3)


def test_vllm_top_k_logprobs_are_renormalised_over_the_k_kept(vllm_setup):
    import torch

    from streamrft.engine.rollout import SamplingParams

    engine, path = vllm_setup
    model, prompts = _prompts(path)
    out = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=6, temperature=0.7, top_k=3, seed=2, top_logprobs=3))
    for prompt, group in zip(prompts, out):
        for c in group:
            logp = _teacher_logprobs(model, prompt, c.token_ids, 0.7, top_k=3)
            for t, tok in enumerate(c.token_ids):
                assert torch.isfinite(logp[t, tok])  # sampled among the 3 kept
                assert abs(c.logprobs[t] - float(logp[t, tok])) < 2e-3
                assert float(torch.tensor([lp for _, lp in c.top_logprobs[t]]).exp().sum()) == pytest.approx(1.0, abs=1e-3)
                values, indices = logp[t].topk(3)
                assert [i for i, _ in c.top_logprobs[t]] == indices.tolist()
                assert torch.allclose(torch.tensor([lp for _, lp in c.top_logprobs[t]]), values, atol=2e-3)


def test_vllm_top_logprobs_are_sorted_and_hold_the_sampled_token_at_its_rank(vllm_setup):
    import torch

    from streamrft.engine.rollout import SamplingParams

    engine, path = vllm_setup
    model, prompts = _prompts(path)
    k = 5
    out = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=6, temperature=1.0, seed=3, top_logprobs=k))
    seen_ranks = set()
    for prompt, group in zip(prompts, out):
        for c in group:
            logp = _teacher_logprobs(model, prompt, c.token_ids)
            assert len(c.top_logprobs) == len(c.token_ids)
            for t, tok in enumerate(c.token_ids):
                tops = c.top_logprobs[t]
                assert len(tops) == k
                assert [lp for _, lp in tops] == sorted((lp for _, lp in tops), reverse=True)
                values, indices = logp[t].topk(k)
                assert [i for i, _ in tops] == indices.tolist()
                assert torch.allclose(torch.tensor([lp for _, lp in tops]), values, atol=2e-3)
                rank = int((logp[t] >= logp[t, tok]).sum())
                seen_ranks.add(min(rank, k + 1))
                if rank <= k:
                    assert tops[rank - 1][0] == tok and tops[rank - 1][1] == pytest.approx(c.logprobs[t], abs=1e-5)
                else:
                    assert tok not in {i for i, _ in tops}
    assert len(seen_ranks) > 1  # samples at more than one rank: a real check of the placement


def test_vllm_greedy_with_n_above_one_gives_n_equal_argmax_completions(vllm_setup):
    import torch

    from streamrft.engine.rollout import SamplingParams

    engine, path = vllm_setup
    model, prompts = _prompts(path)
    out = engine.generate(prompts, SamplingParams(n=3, max_new_tokens=6, temperature=0))  # vLLM refuses n > 1 itself
    for prompt, group in zip(prompts, out):
        assert len(group) == 3 and len({tuple(c.token_ids) for c in group}) == 1
        c = group[0]
        logp = _teacher_logprobs(model, prompt, c.token_ids, temperature=0)  # greedy: the untempered log-softmax
        assert logp.argmax(-1).tolist() == c.token_ids
        assert torch.allclose(torch.tensor(c.logprobs), logp.max(-1).values, atol=2e-3)


def test_vllm_seed_repeats_a_call_and_seeds_each_prompt_apart(vllm_setup):
    from streamrft.engine.rollout import SamplingParams

    engine, path = vllm_setup
    _, prompts = _prompts(path)
    params = SamplingParams(n=2, max_new_tokens=6, temperature=1.0, seed=7)
    same = [prompts[0]] * 3
    first, again = engine.generate(same, params), engine.generate(same, params)
    ids = [[c.token_ids for c in g] for g in first]
    assert ids == [[c.token_ids for c in g] for g in again]
    # one prompt three times in one call: three different pairs of samples, not one stream repeated
    assert len({tuple(map(tuple, g)) for g in ids}) == 3


def test_vllm_per_prompt_seeds_sample_the_same_whatever_shares_the_call(vllm_setup):
    from streamrft.engine.rollout import SamplingParams

    engine, path = vllm_setup
    _, prompts = _prompts(path)
    seeds = list(range(100, 100 + len(prompts)))
    together = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=6, temperature=1.0, seeds=seeds))
    alone = [engine.generate([p], SamplingParams(n=2, max_new_tokens=6, temperature=1.0, seeds=[s]))[0]
             for p, s in zip(prompts, seeds)]
    assert [[c.token_ids for c in g] for g in together] == [[c.token_ids for c in g] for g in alone]
    with pytest.raises(ValueError, match="seeds for"):
        engine.generate(prompts, SamplingParams(n=1, max_new_tokens=2, seeds=seeds[:-1]))


def test_vllm_refuses_a_temperature_it_would_change(vllm_setup):
    from streamrft.engine.rollout import SamplingParams

    engine, path = vllm_setup
    _, prompts = _prompts(path)
    with pytest.raises(ValueError, match="temperature 0.005"):
        engine.generate(prompts, SamplingParams(temperature=0.005))


def test_vllm_load_weights_serves_exactly_the_new_weights(vllm_setup):
    """Last: it replaces the module engine's weights."""
    import torch

    from streamrft.engine.models import state_dict_to_cpu
    from streamrft.engine.rollout import SamplingParams

    engine, path = vllm_setup
    model, prompts = _prompts(path)
    greedy = SamplingParams(n=1, max_new_tokens=6, temperature=0)
    before = engine.generate(prompts, greedy)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # parameters (the tied embedding once), so the HF model is the new version too
        for p in model.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=gen))
    engine.load_weights(state_dict_to_cpu(model), version=2)
    assert engine.version == 2
    after = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=6, temperature=0.9, seed=4))
    assert [c.logprobs for c in after[0]] != [before[0][0].logprobs]
    for prompt, group in zip(prompts, after):
        for c in group:
            expected = _teacher_logprobs(model, prompt, c.token_ids, 0.9).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
            assert torch.allclose(torch.tensor(c.logprobs), expected, atol=2e-3)
    # the prefix cache was dropped: a prompt seen before the swap is not served from the old KV
    again = engine.generate(prompts, greedy)
    for prompt, group in zip(prompts, again):
        logp = _teacher_logprobs(model, prompt, group[0].token_ids, temperature=0)
        assert logp.argmax(-1).tolist() == group[0].token_ids
