"""The module-scoped `served` gateway of the tests here (`gateway_helpers.serving`)."""
from __future__ import annotations

from typing import Iterator

import pytest

from gateway_helpers import Served, gateway_config, serving


@pytest.fixture(scope="module")
def served(stack, tmp_path_factory) -> Iterator[Served]:
    import uuid

    out = tmp_path_factory.mktemp("gateway")
    with serving(gateway_config(stack, out, f"gw-{uuid.uuid4().hex[:8]}", ["monitor.prometheus.enabled=true"])) as s:
        yield s
