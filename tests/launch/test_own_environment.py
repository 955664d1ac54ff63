"""Your own environment, as docs/environments.md has a user bring it (examples/my_env): plugged in by
`import_path`, its `ALPHABET` builds the tiny char model, its `PLAYERS` warm it up on `data.train`'s
tasks; what is missing fails loudly, naming the fix. Warm-up stages are built once, by a hash of what
they are built from, and reused by `streamrft prepare` and every run of the same config."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from streamrft.config import load_config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "my_env.yaml"


@pytest.fixture
def my_env(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "my_env"))  # as PYTHONPATH=examples/my_env does
    yield
    sys.modules.pop("letters", None)


def _cfg(tmp_path, *extra):
    return load_config(EXAMPLE, [f"output_dir={tmp_path / 'out'}", f"model.path={tmp_path / 'base'}",
                                 f"data.train={ROOT / 'examples/my_env/train.jsonl'}",
                                 f"data.eval={ROOT / 'examples/my_env/eval.jsonl'}",
                                 "stages.0.steps=3", "stages.0.data.size=40", *extra])


def test_the_environment_builds_the_model_and_warms_it_up_with_its_own_players(my_env, tmp_path, capsys):
    import letters

    from streamrft.engine.models import load_tokenizer
    from streamrft.launch.prepare import PREPARED, prepare, stage_key
    from streamrft.producers.envs import env_alphabet, env_players
    from streamrft.producers.workflows.demonstrations import mixture
    from streamrft.producers.workflows.episodes import TurnLimits
    from streamrft.producers.tasks import load_task_file

    assert env_players(None, "letters:GuessLetter") is letters.PLAYERS
    assert env_alphabet(None, "letters:GuessLetter") == letters.ALPHABET
    cache = tmp_path / "out" / PREPARED
    cfg = prepare(_cfg(tmp_path), cache=cache)
    tok = load_tokenizer(cfg.model.path)
    assert sorted(set(letters.ALPHABET)) == sorted(t for t in tok.get_vocab() if len(t) == 1)
    assert tok.unk_token_id not in tok(letters.ALPHABET, add_special_tokens=False).input_ids
    (built,) = cache.iterdir()
    assert Path(cfg.model.path) == built.resolve() and (tmp_path / "out" / "stage-0-sft").resolve() == built.resolve()
    # the players' episodes: bisect wins every game, each in at most 4 guesses, on the file's tasks
    tasks = load_task_file(ROOT / "examples/my_env/train.jsonl")[:16]
    demos = mixture(tok, tasks, lambda: letters.GuessLetter(), letters.PLAYERS, {"bisect": 1.0}, seed=0,
                    limits=TurnLimits(4, 96))
    assert all(d.env_reward >= 0.7 for d in demos) and len(demos) == 16
    assert "stage 0 (sft): 3 steps" in capsys.readouterr().out

    # the same config again (a run, or prepare again): the stage is reused, not trained
    again = prepare(_cfg(tmp_path, f"output_dir={tmp_path / 'out' / 'run-2'}"), cache=cache)
    assert Path(again.model.path) == built.resolve() and "reusing" in capsys.readouterr().out
    # a changed stage is another model
    other = _cfg(tmp_path, "stages.0.steps=4")
    assert stage_key(other, 0, "b") != stage_key(_cfg(tmp_path), 0, "b")
    prepare(other, cache=cache)
    assert len(list(cache.iterdir())) == 2


def test_what_an_own_environment_lacks_fails_loudly(my_env, tmp_path):
    from streamrft.launch.prepare import prepare

    with pytest.raises(ModuleNotFoundError, match=r"'nowhere_env:Game': No module named 'nowhere_env'. Put its folder on PYTHONPATH"):
        prepare(_cfg(tmp_path, "explorer.env={import_path: 'nowhere_env:Game'}"))

    with pytest.raises(ValueError, match=r"tests_helpers:Countdown' has no ALPHABET .* set one of them"):
        prepare(_cfg(tmp_path, "explorer.env={import_path: 'tests_helpers:Countdown'}"))
    with pytest.raises(ValueError, match=r"tests_helpers:Countdown' has no PLAYERS dict"):
        prepare(_cfg(tmp_path, "explorer.env={import_path: 'tests_helpers:Countdown'}", "model.build.alphabet=abc"))
    # a task file with characters outside the default alphabet: named, never silently <unk>
    odd = tmp_path / "odd.jsonl"
    odd.write_text(json.dumps({"prompt": "Zürich?", "answer": "ok"}) + "\n")
    with pytest.raises(ValueError, match=r"misses characters of data.train .*: '\?Zikoü'"):
        prepare(load_config(ROOT / "examples" / "cpu_demo.yaml", [f"output_dir={tmp_path / 'o2'}", f"model.path={tmp_path / 'b2'}",
                                                                   f"data.train={odd}", "data.synthetic=null", "stages=[]"]))


@pytest.mark.slow
def test_a_run_plays_the_environment_in_every_role_from_pythonpath(stack, tmp_path):
    """`PYTHONPATH=examples/my_env streamrft run examples/my_env.yaml`, shortened: the launcher's
    evals, the forked explorer and the trainer all find `letters`; `streamrft prepare` then reuses
    the warm-up the run built."""
    import os
    import subprocess

    from tests_helpers import stack_overrides

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "examples" / "my_env"), os.environ.get("PYTHONPATH", "")])}
    args = [sys.executable, "-m", "streamrft.cli", "run", str(EXAMPLE), *stack_overrides(stack, tmp_path),
            "model.build={hidden_size: 32, layers: 1, heads: 2, seed: 0}", "fork_roles=true",
            "stages.0.steps=5", "stages.0.data.size=40", "explorer.num_explorers=1", "stream_ops.drop_zero_variance=false",
            "trainer.max_steps=2", "trainer.batch_groups=2", "eval.every_versions=0", "eval.max_tasks=8", "max_wall_s=300"]
    res = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "stage 0 (sft): 5 steps" in res.stdout and "versions=2" in res.stdout, res.stdout[-2000:]
    (run,) = [p for p in tmp_path.iterdir() if (p / "config.yaml").exists()]
    # `streamrft prepare` of the same config finds the stage the run built
    prep = subprocess.run([sys.executable, "-m", "streamrft.cli", "prepare", *args[4:]], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=env)
    assert prep.returncode == 0 and "stage 0 (sft): reusing" in prep.stdout, prep.stdout[-2000:] + prep.stderr[-2000:]
    assert (tmp_path / "stage-0-sft").resolve() == (run / "stage-0-sft").resolve()
