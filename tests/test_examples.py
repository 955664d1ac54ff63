"""The shipped example configs parse into the parts they promise; the agent and tool examples prepare
(tasks, a char model over the environment's alphabet, a warm-up on scripted episodes)."""
import json
import re
from pathlib import Path

import pytest

from streamrft.config import load_config
from streamrft.producers.tasks import load_task_file

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_math_example_parses_with_vllm_math_verify_and_deepspeed():
    cfg = load_config(ROOT / "examples" / "gsm8k_gpu.yaml")
    assert cfg.explorer.engine.type == "vllm" and cfg.explorer.chat_template
    assert [t.name for t in cfg.stream_ops.rewards] == ["math_verify", "format"]
    assert cfg.trainer.engine == "deepspeed" and cfg.trainer.deepspeed.zero_stage == 2
    assert cfg.model.path.endswith("Qwen2.5-1.5B-Instruct") and cfg.model.build is None


# Qwen2.5-1.5B-Instruct's config.json, which examples/gsm8k_gpu.yaml's memory plan is for
QWEN25_15B = {"vocab": 151936, "hidden": 1536, "layers": 28, "intermediate": 8960, "kv_heads": 2, "head_dim": 128}
GIB = 2**30
# benchmarks/trainer_activation_memory.py at those widths: bytes autograd keeps per layer per token
SAVED_PER_LAYER_TOKEN = 103_480


def _memory_plan(text: str) -> dict[str, tuple[float, float]]:
    """The plan's table rows: who -> (share, GiB)."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"#   (\S.*?)\s{2,}(\d\.\d\d)\s+(\d+\.\d\d)(\s|$)", line)
        if m:
            rows[m.group(1)] = (float(m.group(2)), float(m.group(3)))
    return rows


def _checked_plan(name: str):
    """(the example's text, its config, its plan's rows less `total`), the rows checked to add up to
    the GPU: shares to 1, GiB to the total, each row's GiB its share of it (rounded to two decimals)."""
    path = ROOT / "examples" / name
    text, cfg = path.read_text(), load_config(path)
    plan = _memory_plan(text)
    total = plan.pop("total")
    assert total[0] == 1.0
    assert sum(share for share, _ in plan.values()) == pytest.approx(1.0, abs=0.011)
    assert sum(gib for _, gib in plan.values()) == pytest.approx(total[1], abs=0.011)
    for who, (share, gib) in plan.items():
        assert gib == pytest.approx(share * total[1], abs=0.005 * total[1] + 0.01), who
    assert plan["headroom"][1] > 0
    return text, cfg, plan


def test_gpu_math_example_memory_plan_adds_up_with_the_configs_numbers():
    """Every process on the GPU at once gets a row; the rows add up to the GPU; each row holds what
    the config's settings need (recomputed here), so an edit to either cannot silently overcommit."""
    text, cfg, plan = _checked_plan("gsm8k_gpu.yaml")

    q = QWEN25_15B
    kv_width = q["kv_heads"] * q["head_dim"]
    params = q["vocab"] * q["hidden"] + q["hidden"] + q["layers"] * (
        2 * q["hidden"] * q["hidden"] + q["hidden"] + 2 * (q["hidden"] * kv_width + kv_width)  # q, o; k, v
        + 3 * q["hidden"] * q["intermediate"] + 2 * q["hidden"])  # gate, up, down; two norms
    assert f"{params:,} params" in text
    width = {"bfloat16": 2, "float16": 2, "float32": 4}

    # explorers: one row each, at their gpu_memory_utilization, holding weights + the fixed KV cache
    # (room for max_batch sequences of a 256-token prompt and max_new_tokens) + the fixed parts
    e, ex = cfg.explorer.engine, cfg.explorer
    explorers = {who: row for who, row in plan.items() if who.startswith("explorer-")}
    assert len(explorers) == ex.num_explorers
    assert ex.tasks_per_batch * ex.group_size <= e.max_batch
    kv_per_token = q["layers"] * 2 * kv_width * width[e.dtype or cfg.model.dtype]
    assert e.kv_cache_gib * GIB >= e.max_batch * (256 + ex.sampling.max_new_tokens) * kv_per_token
    activations, cuda_graphs, reload, non_torch = 2.0, 0.5, 0.5, 0.3  # the plan's estimates, GiB
    assert reload * GIB >= q["vocab"] * q["hidden"] * width[e.dtype or cfg.model.dtype]  # the largest layer
    needed = params * width[e.dtype or cfg.model.dtype] / GIB + e.kv_cache_gib + activations + cuda_graphs + reload + non_torch
    for share, gib in explorers.values():
        assert share == e.gpu_memory_utilization and needed <= gib

    # trainer: one DeepSpeed ZeRO-2 rank in bf16: params, grads, fp32 master, Adam m and v, the
    # reference model, the reduce bucket; plus one micro-batch of micro_batch_tokens, x 1.1
    t = cfg.trainer
    assert t.engine == "deepspeed" and t.deepspeed.zero_stage == 2 and t.deepspeed.num_gpus == 1
    assert cfg.model.dtype == "bfloat16" and t.micro_batch_tokens is not None
    reference = width[cfg.model.dtype] if cfg.algorithm.kl.coef > 0 else 0
    static = params * (2 + 2 + 4 + 8 + reference) + 5e8 * 2
    per_token = q["layers"] * SAVED_PER_LAYER_TOKEN + 625_060 + 10 * q["vocab"]
    assert 1.1 * (static + t.micro_batch_tokens * per_token) / GIB <= plan["trainer (DeepSpeed ZeRO-2)"][1]

    # a CUDA context for each explorer, the trainer and the launcher (its start eval's engine closed)
    assert plan["CUDA contexts"][1] >= (ex.num_explorers + 2) * 0.6


# Qwen2.5-VL-3B-Instruct's config.json (the parts that size it), which examples/vlm_gpu.yaml's plan is for
QWEN25_VL_3B = {
    "text_config": {"hidden_size": 2048, "intermediate_size": 11008, "num_attention_heads": 16, "num_hidden_layers": 36,
                    "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
                    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}},
    "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
                      "in_chans": 3, "out_hidden_size": 2048, "patch_size": 14, "spatial_merge_size": 2,
                      "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31], "temporal_patch_size": 2},
    "tie_word_embeddings": True}
# benchmarks/trainer_activation_memory.py at the 3B's language-model widths: bytes a layer saves per
# token (recomputed one layer at a time under checkpointing), and a checkpointed layer's input
SAVED_PER_LAYER_TOKEN_3B, CHECKPOINTED_PER_LAYER_TOKEN_3B = 130_120, 4_096


def test_gpu_vlm_example_memory_plan_adds_up_with_the_configs_and_the_models_numbers():
    """As the math example's: every process on the GPU gets a row, the rows add up, and each holds what
    the settings need, recomputed from Qwen2.5-VL-3B's config (its parameters counted on the meta
    device, the vision tower frozen as the trainer freezes it)."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from streamrft.engine.vlm import freeze_vision_tower

    text, cfg, plan = _checked_plan("vlm_gpu.yaml")

    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**QWEN25_VL_3B))
    params = sum(p.numel() for p in model.parameters())
    frozen = freeze_vision_tower(model)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trainable == params - frozen
    assert f"{params:,} params" in text and f"{trainable:,} trainable" in text and f"{frozen:,} frozen" in text
    q = QWEN25_VL_3B["text_config"]
    width = 2  # bfloat16
    assert cfg.model.dtype == "bfloat16"

    # the explorer: weights + a KV cache of max_batch sequences of max_model_len + the fixed parts;
    # one picture a prompt, and a group per task fits a batch
    e, ex = cfg.explorer.engine, cfg.explorer
    explorers = {who: row for who, row in plan.items() if who.startswith("explorer-")}
    assert len(explorers) == ex.num_explorers and e.max_images == 1
    assert ex.tasks_per_batch * ex.group_size <= e.max_batch
    assert e.max_model_len >= 512 + 256 + ex.sampling.max_new_tokens  # 512 image tokens, a question, the answer
    kv_per_token = q["num_hidden_layers"] * 2 * q["num_key_value_heads"] * (q["hidden_size"] // q["num_attention_heads"]) * width
    assert e.kv_cache_gib * GIB >= e.max_batch * e.max_model_len * kv_per_token
    activations, encoder, cuda_graphs, reload, non_torch = 2.0, 1.0, 0.5, 0.6, 0.3  # the plan's estimates, GiB
    assert reload * GIB >= q["vocab_size"] * q["hidden_size"] * width
    needed = params * width / GIB + e.kv_cache_gib + activations + encoder + cuda_graphs + reload + non_torch
    for share, gib in explorers.values():
        assert share == e.gpu_memory_utilization and needed <= gib

    # the trainer: ZeRO-2 in bf16, the tower frozen (no grads or Adam state for it), no reference
    # model, checkpointed layers: one micro-batch of micro_batch_tokens, x 1.1
    t = cfg.trainer
    assert t.engine == "deepspeed" and t.deepspeed.zero_stage == 2 and t.deepspeed.num_gpus == 1
    assert t.freeze_vision_tower and t.gradient_checkpointing and cfg.algorithm.kl.coef == 0
    static = params * width + trainable * (2 + 4 + 8) + 5e8 * 2
    per_token = (q["num_hidden_layers"] * CHECKPOINTED_PER_LAYER_TOKEN_3B + SAVED_PER_LAYER_TOKEN_3B
                 + 630_312 + 10 * q["vocab_size"])
    assert 1.1 * (static + t.micro_batch_tokens * per_token) / GIB <= plan["trainer (DeepSpeed ZeRO-2)"][1]
    assert t.micro_batch_tokens >= e.max_model_len  # the longest sequence fits one micro-batch
    assert plan["CUDA contexts"][1] >= (ex.num_explorers + 2) * 0.6


def test_vlm_sample_rows_load_as_picture_tasks_and_verify(tmp_path):
    from streamrft.infra.media import inspect
    from streamrft.stream_ops.rewards import resolve_reward

    rows = [json.loads(line) for line in open(ROOT / "examples" / "data" / "vlm_sample.jsonl")]
    tasks = load_task_file(ROOT / "examples" / "data" / "vlm_sample.jsonl", with_images=False)
    assert [t.answer for t in tasks] == [r["answer"] for r in rows] and all("\\boxed{}" in t.prompt for t in tasks)
    for r in rows:  # each picture a PNG within the plan's 401,408 pixels
        mime, w, h = inspect((ROOT / "examples" / "data" / r["image"]).read_bytes())
        assert mime == "image/png" and w * h <= 401_408
    reward = resolve_reward("math_verify")
    assert reward(f"the answer is \\boxed{{{rows[0]['answer']}}}", tasks[0].answer) == 1.0


def test_gsm8k_sample_rows_load_as_tasks_and_verify():
    from streamrft.stream_ops.rewards import resolve_reward

    tasks = load_task_file(ROOT / "examples" / "data" / "gsm8k_sample.jsonl")
    assert [t.answer for t in tasks] == ["29", "150", "14"]
    reward = resolve_reward("math_verify")
    assert reward("so the answer is \\boxed{29}", tasks[0].answer) == 1.0
    assert reward("\\boxed{30}", tasks[0].answer) == 0.0


def _prepared(name: str, tmp_path, steps: int = 3, extra: tuple[str, ...] = ()):
    import json

    from streamrft.launch.prepare import prepare

    cfg = load_config(ROOT / "examples" / name, [f"output_dir={tmp_path}", f"model.path={tmp_path / 'base'}",
                                                 "data.synthetic.train_size=50", "data.synthetic.eval_size=10", *extra])
    cfg.stages[0].steps = steps
    cfg = prepare(cfg)
    rows = [json.loads(line) for line in open(cfg.data.train)]
    return cfg, rows


def test_agent_example_prepares_game_tasks_a_char_model_over_its_alphabet_and_a_demo_warmup(tmp_path):
    from streamrft.engine.models import load_tokenizer
    from streamrft.producers.envs import guess_number

    cfg, rows = _prepared("agent_cpu.yaml", tmp_path)
    assert cfg.explorer.workflow == "multi_turn" and cfg.explorer.env.type == "guess_number"
    assert cfg.model.path.endswith("stage-0-sft") and "demos" in cfg.stages[0].data
    assert len(rows) == 50 and {r["prompt"] for r in rows} == {"guess 1-8:"}
    assert {int(r["answer"]) for r in rows} <= set(range(1, 9))
    eval_ids = {json.loads(line)["task_id"] for line in open(cfg.data.eval)}
    assert not eval_ids & {r["task_id"] for r in rows}  # other draws
    tok = load_tokenizer(cfg.model.path)
    assert tok.unk_token_id not in tok(guess_number.ALPHABET, add_special_tokens=False).input_ids


def test_tool_example_prepares_calculator_tasks(tmp_path):
    from streamrft.engine.models import load_tokenizer
    from streamrft.producers.envs import calculator

    cfg, rows = _prepared("tool_cpu.yaml", tmp_path)
    assert cfg.explorer.env.type == "calculator" and cfg.stream_ops.rewards[0].name == "env"
    assert all(r["prompt"].endswith("?") and max(int(x) for x in r["prompt"][:-1].replace("*", "+").replace("-", "+").split("+")) <= 99
               for r in rows)
    tok = load_tokenizer(cfg.model.path)
    assert tok.unk_token_id not in tok(calculator.ALPHABET, add_special_tokens=False).input_ids


def test_a_demo_stage_needs_an_environment_with_scripted_players(tmp_path):
    import pytest

    from streamrft.launch.prepare import prepare

    cfg = load_config(ROOT / "examples" / "agent_cpu.yaml", [f"output_dir={tmp_path}", f"model.path={tmp_path / 'base'}",
                                                             "explorer.env={import_path: 'tests_helpers:Countdown'}"])
    with pytest.raises(ValueError, match=r"data.demos needs the environment's scripted players: .*'tests_helpers:Countdown' "
                                         r"has no PLAYERS dict"):
        prepare(cfg)


def test_judge_example_scores_with_a_local_judge_that_falls_back():
    cfg = load_config(ROOT / "examples" / "judge_cpu.yaml")
    (term,) = cfg.stream_ops.rewards
    assert term.name == "judge" and term.params["backend"] == "local" and term.fallback == 0.0
    assert "{response}" in term.params["template"] and "{answer}" in term.params["template"]
    assert cfg.model.build is not None and cfg.data.synthetic["task"] == "reverse"


def test_vlm_example_prepares_a_vision_language_model_picture_tasks_and_a_warmup_on_them(tmp_path):
    import torch
    from PIL import Image

    from streamrft.engine.models import is_vision_language, load_policy, load_processor
    from streamrft.producers.image_tasks import ALPHABET, split_of

    base_cfg = load_config(ROOT / "examples" / "vlm_cpu.yaml")
    assert base_cfg.model.build.vision is not None and base_cfg.stream_ops.rewards[0].name == "exact_match"
    assert base_cfg.stages[1].data["decoy_frac"] > 0  # the warm-up's habit for RL to unlearn
    cfg, rows = _prepared("vlm_cpu.yaml", tmp_path, steps=4,
                          extra=("stages.0.data.size=64", "stages.1.steps=3", "stages.1.data.size=64"))
    assert cfg.model.path.endswith("stage-1-sft") and is_vision_language(cfg.model.path)
    proc = load_processor(cfg.model.path)  # the stage saved its processor beside the weights
    assert proc.tokenizer.unk_token_id not in proc.tokenizer(ALPHABET, add_special_tokens=False).input_ids
    eval_rows = [json.loads(line) for line in open(cfg.data.eval)]
    assert len(rows) == 50 and len(eval_rows) == 10
    for split, some in (("train", rows), ("eval", eval_rows)):
        for r in some:  # a path relative to the task file, to a picture of this split by its pixels' hash
            im = Image.open(Path(cfg.data.train).parent / r["image"])
            assert im.size == (32, 32) and split_of(im.convert("RGB").tobytes()) == split
    # the warm-up trained the vision tower: the pictures' pixels reached the loss
    built, _ = load_policy(tmp_path / "base")
    warmed, _ = load_policy(cfg.model.path)
    tower = [n for n, _ in built.named_parameters() if "vision_tower" in n]
    assert tower and any(not torch.equal(dict(built.named_parameters())[n], dict(warmed.named_parameters())[n]) for n in tower)


def test_a_tiny_vision_spec_names_what_does_not_fit():
    from streamrft.config.base import ConfigError

    with pytest.raises(ConfigError, match=r"model.build.vision: patch_size \(5\) must divide image_size \(32\)"):
        load_config(ROOT / "examples" / "vlm_cpu.yaml", ["model.build.vision.patch_size=5"])
    with pytest.raises(ConfigError, match=r"model.build.vision: heads \(3\) must divide hidden_size \(64\)"):
        load_config(ROOT / "examples" / "vlm_cpu.yaml", ["model.build.vision.heads=3"])
