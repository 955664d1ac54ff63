"""The shipped example configs: the GPU math config parses into the parts it promises."""
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
