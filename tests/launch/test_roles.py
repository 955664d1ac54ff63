"""Roles forked from the launcher's fork server (`launch/roles.py`) behave as the subprocesses they
replace: the same command's output in their log, its exit code, a signal's negative code; they
take the launcher's environment and working directory as they are when the role starts (a server
started earlier knows neither), and run in a session of their own."""
from __future__ import annotations

import os
import signal
import uuid

import pytest

from streamrft.config import dump_config
from streamrft.launch.roles import Role, spawn, start_server
from tests_helpers import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def server():
    start_server()


def test_a_forked_role_writes_what_a_subprocess_writes_and_exits_with_its_code(tmp_path):
    for fork in (True, False):
        ok, bad = tmp_path / f"ok-{fork}.log", tmp_path / f"bad-{fork}.log"
        assert spawn(["train", "--help"], ok, fork).wait(120) == 0
        assert spawn(["train", str(tmp_path / "no_such_config.yaml")], bad, fork).wait(120) != 0
    assert (tmp_path / "ok-True.log").read_text() == (tmp_path / "ok-False.log").read_text()
    assert "usage: streamrft train" in (tmp_path / "ok-True.log").read_text()
    assert "no_such_config.yaml" in (tmp_path / "bad-True.log").read_text()


def _text(path) -> str:
    return path.read_text() if path.exists() else ""  # the role creates its log as it starts


def test_a_forked_role_takes_the_environment_and_directory_of_its_start(tmp_path, stack, namespace, monkeypatch):
    from gateway_helpers import gateway_config

    var = f"STREAMRFT_TEST_KEY_{uuid.uuid4().hex[:8].upper()}"
    cfg = gateway_config(stack, tmp_path, namespace, [f"gateway.teams=[{{name: agents, key_env: {var}}}]"])
    (tmp_path / "config.yaml").write_text(dump_config(cfg))
    monkeypatch.chdir(tmp_path)  # the role reads ./config.yaml: the launcher's directory, not the server's

    missing = Role(["serve", "config.yaml"], tmp_path / "missing.log")
    assert missing.wait(120) == 1
    assert f"environment variable {var} is not set" in (tmp_path / "missing.log").read_text()

    monkeypatch.setenv(var, "a-key")  # set after the server started: the role must see it
    role = Role(["serve", "config.yaml"], tmp_path / "serve.log")
    try:
        wait_for(lambda: role.poll() is not None or "gateway: http://" in _text(tmp_path / "serve.log"),
                 120, "the gateway serving")
        assert role.poll() is None, (tmp_path / "serve.log").read_text()[-2000:]
        assert os.getsid(role.pid) == role.pid != os.getsid(0)  # a session of its own, as start_new_session
        role.terminate()
        assert role.wait(60) in (0, -signal.SIGTERM)
    finally:
        role.kill()

    killed = Role(["serve", "config.yaml"], tmp_path / "killed.log")
    wait_for(lambda: "gateway: http://" in _text(tmp_path / "killed.log"), 120, "the second gateway serving")
    killed.kill()
    assert killed.wait(30) == -signal.SIGKILL
    assert killed.poll() == killed.returncode == -signal.SIGKILL
