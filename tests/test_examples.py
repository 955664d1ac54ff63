"""The shipped example configs parse into the parts they promise; the agent and tool examples prepare
(tasks, a char model over the environment's alphabet, a warm-up on scripted episodes)."""
import json
from pathlib import Path

from streamrft.config import load_config
from streamrft.producers.tasks import load_task_file

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_math_example_parses_with_vllm_math_verify_and_deepspeed():
    cfg = load_config(ROOT / "examples" / "gsm8k_gpu.yaml")
    assert cfg.explorer.engine.type == "vllm" and cfg.explorer.chat_template
    assert [t.name for t in cfg.stream_ops.rewards] == ["math_verify", "format"]
    assert cfg.trainer.engine == "deepspeed" and cfg.trainer.deepspeed.zero_stage == 2
    assert cfg.model.path.endswith("Qwen2.5-1.5B-Instruct") and cfg.model.build is None


def test_gsm8k_sample_rows_load_as_tasks_and_verify():
    from streamrft.stream_ops.rewards import resolve_reward

    tasks = load_task_file(ROOT / "examples" / "data" / "gsm8k_sample.jsonl")
    assert [t.answer for t in tasks] == ["29", "150", "14"]
    reward = resolve_reward("math_verify")
    assert reward("so the answer is \\boxed{29}", tasks[0].answer) == 1.0
    assert reward("\\boxed{30}", tasks[0].answer) == 0.0


def _prepared(name: str, tmp_path, steps: int = 3):
    import json

    from streamrft.launch.prepare import prepare

    cfg = load_config(ROOT / "examples" / name, [f"output_dir={tmp_path}", f"model.path={tmp_path / 'base'}",
                                                 "data.synthetic.train_size=50", "data.synthetic.eval_size=10"])
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
    with pytest.raises(ValueError, match=r"data.demos needs explorer.env.type in \['calculator', 'guess_number'\]"):
        prepare(cfg)
