"""The launcher's and roles' consoles: no transformers or datasets bars for tiny loads and saves,
no DeepSpeed "Setting accelerator to CPU" warning, while streamrft's own bars and real warnings
stay."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import logging
import sys
if sys.argv[1] == "quiet":
    from streamrft.launch.quiet import quiet_libraries
    quiet_libraries()
from streamrft.engine.models import build_char_tokenizer, build_tiny_model, load_policy
path = sys.argv[2]
build_tiny_model(path, build_char_tokenizer("abc"), hidden_size=16, layers=1, heads=2)
load_policy(path)
from deepspeed.accelerator import get_accelerator
get_accelerator()
from datasets import load_dataset
rows = path + ".jsonl"
open(rows, "w").write('{"prompt": "p", "answer": "a"}\\n')
load_dataset("json", data_files=rows, cache_dir=path + "-cache")
logging.getLogger("DeepSpeed").warning("a real DeepSpeed warning")
"""

NOISE = ("Loading weights", "Writing model shards", "Setting accelerator to CPU", "Generating train split")


def _run(mode: str, tmp_path: Path) -> str:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    res = subprocess.run([sys.executable, "-c", SCRIPT, mode, str(tmp_path / mode)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout + res.stderr


def test_library_noise_is_silenced_and_real_warnings_stay(tmp_path):
    loud = _run("loud", tmp_path)
    assert all(line in loud for line in NOISE), loud[-3000:]  # what the test would miss: present without it
    quiet = _run("quiet", tmp_path)
    assert not [line for line in NOISE if line in quiet], quiet[-3000:]
    assert "a real DeepSpeed warning" in quiet
