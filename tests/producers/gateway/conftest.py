"""The module-scoped `served` gateway of the tests here (`gateway_helpers.serving`)."""
from __future__ import annotations

from typing import Iterator

import pytest

from gateway_helpers import Served, gateway_config, serving


@pytest.fixture(scope="module")
def served(stack, tmp_path_factory) -> Iterator[Served]:
    import uuid

    out = tmp_path_factory.mktemp("gateway")
    # batch_groups 8: room for the module's groups with no trainer, (0 + 1 + 1) x 8
    extra = ["monitor.prometheus.enabled=true", "trainer.batch_groups=8"]
    with serving(gateway_config(stack, out, f"gw-{uuid.uuid4().hex[:8]}", extra)) as s:
        yield s
