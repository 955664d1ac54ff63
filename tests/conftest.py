"""Shared fixtures: the real embedded stack (Tansu on SeaweedFS), a topic namespace per test, and
the `gpu` marker.

`stack` is started once per session on free ports and stopped at the end, also when a test fails.
Tests that kill or restart a server take `private_stack` instead, so they never disturb the
shared one. Nothing here imports torch at module level: collection stays fast on CPU machines.
"""
from __future__ import annotations

import os
import re
import shutil
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from streamrft.config import KafkaConfig, S3Config
from streamrft.infra.stack import S3_KEY, EmbeddedStack, StackError, StackState, free_ports

BUCKET = "weights"


@dataclass
class StackHandle:
    """A running embedded stack and client configs pointing at it."""

    embedded: EmbeddedStack
    kafka: KafkaConfig
    s3: S3Config

    @property
    def state(self) -> StackState:
        # re-read: restart() records new PIDs in the state file
        return self.embedded.load_state()


@contextmanager
def running_stack(data_dir: Path) -> Iterator[StackHandle]:
    """Start an embedded stack under `data_dir` on free ports; stop exactly its PIDs afterwards."""
    for attempt in range(3):
        es = EmbeddedStack(data_dir / f"try{attempt}" if attempt else data_dir, buckets=(BUCKET,), **free_ports())
        try:
            state = es.up()
            break
        except StackError as e:
            # another process bound one of the picked ports between the check and the server's bind
            es.down()
            if "address already in use" not in str(e) or attempt == 2:
                raise
    try:
        yield StackHandle(
            embedded=es,
            kafka=KafkaConfig(bootstrap=state.kafka),
            s3=S3Config(endpoint=state.s3, access_key=S3_KEY, secret_key=S3_KEY, bucket=BUCKET),
        )
    finally:
        # also runs when up() failed half-way (weed started, tansu did not)
        es.down()


@pytest.fixture(scope="session")
def stack(tmp_path_factory) -> Iterator[StackHandle]:
    with running_stack(tmp_path_factory.mktemp("stack")) as handle:
        yield handle


@pytest.fixture
def private_stack(tmp_path_factory) -> Iterator[StackHandle]:
    """A stack of the test's own, for tests that kill -9 or restart the servers."""
    with running_stack(tmp_path_factory.mktemp("private-stack")) as handle:
        yield handle


@pytest.fixture
def namespace(request) -> str:
    """A topic namespace no other test (or earlier run on the same broker) uses."""
    name = re.sub(r"[^A-Za-z0-9_-]", "_", request.node.name)[:40]
    return f"{name}-{uuid.uuid4().hex[:8]}"


def pytest_collection_modifyitems(config, items):
    _long_files_first(items)
    _skip_gpu_tests_without_one(items)


def _long_files_first(items) -> None:
    """Files holding a `slow` or `real_model` test go first, the whole-loop ones (tests/test_*.py) first of all.

    CI spreads whole files over three workers (`--dist loadfile --no-loadscope-reorder`) in collection
    order. In xdist's default order (files with the most tests first) the longest end-to-end files,
    of one or two tests each, came last, so one worker ran a three-minute file while the others had
    nothing left; started first, the short files fill in around them.
    """
    long_files = {item.path for item in items if item.get_closest_marker("slow") or item.get_closest_marker("real_model")}

    def order(item) -> tuple[int, int]:
        if item.path not in long_files:
            return (1, 0)
        return (0, len(item.path.parts))

    items.sort(key=order)  # stable: files and the tests in each keep their order


def _skip_gpu_tests_without_one(items) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch  # only when a gpu test was collected: importing torch costs ~2 s

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)


CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture
def chrome(tmp_path):
    """Headless Chromium driven by Debian's chromedriver (the dashboard's and the labelling page's tests)."""
    if not Path(CHROMEDRIVER).exists() or shutil.which("chromium") is None:
        missing = "Debian's chromium and chromium-driver are not installed (bash scripts/install.sh installs them)"
        if os.environ.get("STREAMRFT_REQUIRE_BROWSER"):  # CI: a browser test that skips proves nothing
            pytest.fail(missing)
        pytest.skip(missing)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1500,2400", f"--user-data-dir={tmp_path / 'chrome-profile'}"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the page's console, shown on a failure
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        yield driver
    except BaseException:
        for entry in driver.get_log("browser"):
            print("browser console:", entry.get("level"), entry.get("message"))
        raise
    finally:
        driver.quit()  # ends chromedriver and every chromium process it started
