"""Model building/loading, the transformers rollout engine and the SFT warm-up, on a tiny Qwen2."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from streamrft.engine.models import (  # noqa: E402
    SPECIAL_TOKENS,
    build_char_tokenizer,
    build_tiny_model,
    load_policy,
    load_tokenizer,
    state_dict_to_cpu,
)
from streamrft.engine.rollout import SamplingParams, make_engine  # noqa: E402
from streamrft.engine.rollout.hf import TransformersEngine  # noqa: E402
from streamrft.engine.sft import _batch, lr_factor, pair_sequence, sft_warmup  # noqa: E402
from streamrft.producers.synthetic import ALPHABET  # noqa: E402

PROMPTS = ["rev abc=", "rev hgfedc=", "rev a="]  # different lengths: exercises left padding
# the engine's tests run on the CPU, and on the GPU where one is visible (`gpu`: skipped without one)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    build_tiny_model(path, build_char_tokenizer(ALPHABET), hidden_size=32, layers=2, heads=4, seed=0)
    return path


@pytest.fixture(scope="module", params=DEVICES)
def engine(model_dir, request):
    torch.set_num_threads(1)
    return TransformersEngine(str(model_dir), device=request.param, max_batch=8)


def _ids(engine, texts):
    return [engine.tokenizer(t).input_ids for t in texts]


def test_char_tokenizer_round_trip(tmp_path):
    tok = build_char_tokenizer("cab ", tmp_path)
    assert tok.convert_ids_to_tokens([0, 1, 2, 3]) == list(SPECIAL_TOKENS)
    ids = tok("ab c").input_ids
    assert ids[0] == tok.bos_token_id and len(ids) == 5  # BOS + one id per character, space included
    assert tok.decode(ids, skip_special_tokens=True) == "ab c"
    assert tok("z", add_special_tokens=False).input_ids == [tok.unk_token_id]
    loaded = load_tokenizer(tmp_path)
    assert loaded("ab c").input_ids == ids
    assert (loaded.pad_token_id, loaded.eos_token_id, loaded.padding_side) == (0, 2, "left")


def test_tiny_model_saves_and_loads(model_dir):
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in model_dir.iterdir()}
    model, tok = load_policy(model_dir)
    # a Qwen2 config must not make AutoTokenizer swap in Qwen2Tokenizer (which drops spaces)
    assert tok.decode(tok("rev ab=").input_ids, skip_special_tokens=True) == "rev ab="
    again, _ = load_policy(model_dir)
    ids = torch.tensor([tok("rev abc=").input_ids])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, again(ids).logits)
    assert model.config.vocab_size == len(tok) and model.config.tie_word_embeddings


def test_engine_logprobs_match_teacher_forcing(engine):
    prompts = _ids(engine, PROMPTS)
    temperature = 0.7
    out = engine.generate(prompts, SamplingParams(n=3, max_new_tokens=6, temperature=temperature, seed=1))
    assert [len(group) for group in out] == [3, 3, 3]
    for prompt, group in zip(prompts, out):
        for c in group:
            assert len(c.token_ids) == len(c.logprobs) >= 1
            ends_on_eos = c.token_ids[-1] == engine.tokenizer.eos_token_id
            assert c.finish_reason == ("stop" if ends_on_eos else "length")
            assert engine.tokenizer.eos_token_id not in c.token_ids[:-1]
            assert c.text == engine.tokenizer.decode(c.token_ids, skip_special_tokens=True)
            seq = torch.tensor([prompt + c.token_ids], device=engine.device)
            with torch.no_grad():
                logits = engine.model(seq).logits[0, len(prompt) - 1 : -1].cpu() / temperature
            expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
            assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-4)


def test_greedy_is_deterministic_and_seed_repeats(engine):
    prompts = _ids(engine, PROMPTS)
    greedy = SamplingParams(n=2, max_new_tokens=6, temperature=0)
    a, b = engine.generate(prompts, greedy), engine.generate(prompts, greedy)
    assert [[c.token_ids for c in g] for g in a] == [[c.token_ids for c in g] for g in b]
    assert all(g[0].token_ids == g[1].token_ids for g in a)  # n greedy copies agree
    sampled = SamplingParams(n=4, max_new_tokens=6, temperature=1.0, seed=7)
    x, y = engine.generate(prompts, sampled), engine.generate(prompts, sampled)
    assert [[c.token_ids for c in g] for g in x] == [[c.token_ids for c in g] for g in y]


def test_a_seeded_generate_leaves_the_process_rngs_as_it_found_them(engine):
    """A seed picks the samples without touching the global RNGs: the CPU's, and on a GPU that
    device's (the one `generate` samples from there)."""
    prompts = _ids(engine, PROMPTS)
    on_gpu = engine.device.startswith("cuda")
    torch.manual_seed(123)
    cpu_before = torch.get_rng_state()
    gpu_before = torch.cuda.get_rng_state() if on_gpu else None
    engine.generate(prompts, SamplingParams(n=2, max_new_tokens=4, temperature=1.0, seed=5))
    assert torch.equal(torch.get_rng_state(), cpu_before)
    if on_gpu:
        assert torch.equal(torch.cuda.get_rng_state(), gpu_before)
    unseeded = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=4, temperature=1.0))
    assert not torch.equal(torch.cuda.get_rng_state() if on_gpu else torch.get_rng_state(),
                           gpu_before if on_gpu else cpu_before)  # an unseeded call draws from them
    assert len(unseeded) == len(prompts)


def test_shared_prefill_equals_one_prefill_per_sample(engine):
    """n samples of a prompt share one prefill (its KV cache repeated n times): the greedy ids and
    log-probs equal those of n separate copies of the prompt, whatever the padding (a one-token
    prompt, whose shared part is all padding, included)."""
    prompts = _ids(engine, ["", *PROMPTS])
    assert len(prompts[0]) == 1
    greedy = SamplingParams(n=3, max_new_tokens=6, temperature=0)
    assert engine._shared_prefill(prompts, max(map(len, prompts)), greedy.n) is not None
    shared = engine.generate(prompts, greedy)
    copies = engine.generate([p for p in prompts for _ in range(3)], SamplingParams(n=1, max_new_tokens=6, temperature=0))
    for i, group in enumerate(shared):
        for j, c in enumerate(group):
            alone = copies[3 * i + j][0]
            assert c.token_ids == alone.token_ids
            assert torch.allclose(torch.tensor(c.logprobs), torch.tensor(alone.logprobs), atol=1e-5)


def test_per_prompt_seeds_sample_the_same_tokens_whatever_shares_the_call(engine):
    """With `seeds`, a prompt's samples do not depend on the call's other prompts, their order or
    the batch size; the log-probs are the tempered, top-k truncated distribution's (teacher forcing),
    and different seeds sample differently."""
    prompts = _ids(engine, PROMPTS)
    params = SamplingParams(n=3, max_new_tokens=6, temperature=0.8, top_k=5, seeds=[11, 22, 33])
    together = engine.generate(prompts, params)
    reordered = engine.generate(prompts[::-1], SamplingParams(n=3, max_new_tokens=6, temperature=0.8, top_k=5,
                                                              seeds=[33, 22, 11]))[::-1]
    alone = [engine.generate([p], SamplingParams(n=3, max_new_tokens=6, temperature=0.8, top_k=5, seeds=[s]))[0]
             for p, s in zip(prompts, [11, 22, 33])]
    for a, b, c in zip(together, reordered, alone):
        assert [x.token_ids for x in a] == [x.token_ids for x in b] == [x.token_ids for x in c]
        for x, y in zip(a, c):
            assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5)
    for prompt, group in zip(prompts, together):
        for c in group:
            seq = torch.tensor([prompt + c.token_ids], device=engine.device)
            with torch.no_grad():
                logits = engine.model(seq).logits[0, len(prompt) - 1 : -1].cpu()
            expected = _tempered(logits, 0.8, top_k=5)
            expected = expected.gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
            assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-4)
    other = engine.generate(prompts, SamplingParams(n=3, max_new_tokens=6, temperature=0.8, top_k=5, seeds=[1, 2, 3]))
    assert [[x.token_ids for x in g] for g in other] != [[x.token_ids for x in g] for g in together]
    with pytest.raises(ValueError, match="2 seeds for 3 prompts"):
        engine.generate(prompts, SamplingParams(n=1, max_new_tokens=2, seeds=[1, 2]))


def test_per_prompt_seeds_sample_the_tempered_distribution():
    """Gumbel-max with a stream per row draws from softmax(logits / T): over 4,000 rows of one
    set of logits, each token's frequency is within 3 % of its probability."""
    from streamrft.engine.rollout.hf import SeededSampler

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -30.0]]).repeat(4000, 1)
    sampler = SeededSampler(list(range(4000)), temperature=2.0, top_k=0, top_p=1.0)
    picks = sampler(None, logits).argmax(-1)
    want = torch.softmax(logits[0] / 2.0, -1)
    got = torch.bincount(picks, minlength=5).float() / 4000
    assert torch.allclose(got, want, atol=0.03)
    assert torch.allclose(sampler.log_probs[0][0], torch.log_softmax(logits[0] / 2.0, -1))


@pytest.mark.parametrize("device", DEVICES)
def test_load_weights_changes_outputs(model_dir, device):
    eng = TransformersEngine(str(model_dir), device=device, max_batch=8)
    prompts = _ids(eng, PROMPTS)
    greedy = SamplingParams(n=1, max_new_tokens=6, temperature=0)
    before = eng.generate(prompts, greedy)
    gen = torch.Generator().manual_seed(0)
    new = {k: v + 0.5 * torch.randn(v.shape, generator=gen) for k, v in state_dict_to_cpu(eng.model).items()}
    new.pop("lm_head.weight", None)  # tied to the embedding: may be left out
    eng.load_weights(new, version=3)
    after = eng.generate(prompts, greedy)
    assert eng.version == 3
    assert [g[0].logprobs for g in before] != [g[0].logprobs for g in after]
    assert torch.equal(eng.model.state_dict()["model.norm.weight"].cpu(), new["model.norm.weight"])
    assert eng.model.model.norm.weight.device.type == torch.device(device).type  # loaded where the engine runs
    with pytest.raises(KeyError):
        eng.load_weights({"not.a.param": torch.zeros(1)}, version=4)


def test_make_engine_names():
    with pytest.raises(ValueError, match="transformers"):
        make_engine("nope", "/tmp/x")


def test_sft_warmup_learns_completion_only(model_dir):
    model, tok = load_policy(model_dir)
    pairs = [("rev ab=", "ba"), ("rev cde=", "edc")]
    losses = sft_warmup(model, tok, pairs, steps=40, batch_size=4, lr=3e-3, seed=0)
    assert len(losses) == 40 and losses[-1] < 0.5 * losses[0]
    # the prompt is masked: only completion tokens (and EOS) count towards the loss
    ids, mask, labels = _batch(tok, [pair_sequence(tok, "rev ab=", "ba")])
    assert (labels != -100).sum().item() == 3
    assert labels[0, -3:].tolist() == tok("ba", add_special_tokens=False).input_ids + [tok.eos_token_id]


def test_lr_factor_warms_up_then_holds_or_decays_by_cosine():
    # warm-up over 4 steps: 1/4, 2/4, 3/4, 4/4 of lr
    assert [lr_factor(i, 10, 4) for i in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    # cosine over the 6 steps after the warm-up, to min_lr_ratio 0.2: cos(pi/2) at the middle gives
    # 0.2 + 0.8 * 0.5 = 0.6, and 0.2 at and after the last step
    cos = [lr_factor(i, 10, 4, "cosine", 0.2) for i in (4, 7, 10, 12)]
    assert cos == pytest.approx([1.0, 0.6, 0.2, 0.2])
    with pytest.raises(ValueError, match="schedule='linear'"):
        lr_factor(5, 10, 0, "linear")


def test_explorer_engine_dtype_overrides_the_model_dtype(model_dir, monkeypatch):
    """(On a CPU with bfloat16 kernels; without them the engine keeps float32: test_precision.py.)"""
    import streamrft.engine.precision as precision
    from streamrft.config import RunConfig
    from streamrft.engine.rollout import engine_from_config

    precision.usable_dtype.cache_clear()
    monkeypatch.setattr(precision, "cpu_bf16_fast", lambda: True)
    cfg = RunConfig(model={"path": str(model_dir)}, explorer={"engine": {"dtype": "bfloat16"}})
    eng = engine_from_config(cfg)
    precision.usable_dtype.cache_clear()
    assert next(eng.model.parameters()).dtype == torch.bfloat16
    out = eng.generate(_ids(eng, PROMPTS), SamplingParams(n=2, max_new_tokens=4, temperature=1.0, seed=0))
    assert all(len(c.token_ids) == len(c.logprobs) >= 1 for group in out for c in group)
    assert next(engine_from_config(RunConfig(model={"path": str(model_dir)})).model.parameters()).dtype == torch.float32


def _tempered(logits: torch.Tensor, temperature: float, top_k: int = 0) -> torch.Tensor:
    """Log-probs of the distribution the engine samples from, recomputed here by hand."""
    scaled = logits / temperature
    if top_k:
        kth = scaled.topk(top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    return torch.log_softmax(scaled, dim=-1)


def test_recorded_logprobs_are_the_sampled_distribution_whatever_the_checkpoint_says(tmp_path):
    """A checkpoint whose generation_config.json sets repetition_penalty, top_k and a minimum length
    (as real ones do): the engine samples from exactly what SamplingParams names, and the recorded
    log-probs equal a teacher-forced recomputation under those settings to 1e-5 (with top-k: the
    truncated, renormalised distribution, every sampled token inside it)."""
    from transformers import GenerationConfig

    model = build_tiny_model(tmp_path, build_char_tokenizer(ALPHABET), hidden_size=32, layers=2, heads=4, seed=1)
    GenerationConfig(do_sample=True, repetition_penalty=1.8, top_k=2, min_new_tokens=5, no_repeat_ngram_size=1,
                     bos_token_id=model.config.bos_token_id, eos_token_id=model.config.eos_token_id,
                     pad_token_id=model.config.pad_token_id).save_pretrained(tmp_path)
    torch.set_num_threads(1)
    eng = TransformersEngine(str(tmp_path), max_batch=16)
    kept = {k for k in eng.model.generation_config.to_diff_dict() if k != "transformers_version"}
    assert kept == {"bos_token_id", "eos_token_id", "pad_token_id"}
    prompts = _ids(eng, PROMPTS)
    for top_k in (0, 4):
        out = eng.generate(prompts, SamplingParams(n=4, max_new_tokens=8, temperature=0.8, top_k=top_k, seed=3))
        repeats = 0
        for prompt, group in zip(prompts, out):
            for c in group:
                seq = torch.tensor([prompt + c.token_ids])
                with torch.no_grad():
                    logits = eng.model(seq).logits[0, len(prompt) - 1: -1]
                expected = _tempered(logits, 0.8, top_k).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
                assert torch.isfinite(expected).all()  # with top-k: every sampled token is among the k
                assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-5), (top_k, c.token_ids)
                repeats += len(c.token_ids) - len(set(c.token_ids))
        assert repeats > 0  # no_repeat_ngram_size=1 from the checkpoint would forbid any repeated token
