"""Library noise a person would have to read past, silenced for the launcher and the roles.

transformers draws a `Loading weights` bar for every model load and a `Writing model shards` bar for
every `save_pretrained` (each version's checkpoint), and datasets a `Generating train split` bar
for every task file it reads: tiny, instant, and one after another in the console and the roles'
logs. DeepSpeed, imported on the way by transformers' checkpoint code, warns
"Setting accelerator to CPU" on a machine without a GPU, where CPU is what a user asked for. The
bars a person waits on are streamrft's own (`monitor.bars`: conversion, SFT stages, export,
replay) and stay; warnings that say something is wrong stay too.
"""
from __future__ import annotations

import logging
import os
import sys

_CPU_ACCELERATOR = "Setting accelerator to CPU"


class _DropCpuAccelerator(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_CPU_ACCELERATOR)


def quiet_libraries() -> None:
    """Call at the start of a command, before or after transformers is imported (idempotent).

    The environment variable reaches processes started later (the fork server, fresh roles);
    `disable_progress_bar` covers a process that imported transformers already."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' bars read it at import
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # and datasets' theirs
    transformers_logging = sys.modules.get("transformers.utils.logging")
    if transformers_logging is not None:
        transformers_logging.disable_progress_bar()
    datasets_tqdm = sys.modules.get("datasets.utils.tqdm")
    if datasets_tqdm is not None:
        datasets_tqdm.disable_progress_bars()
    deepspeed_logger = logging.getLogger("DeepSpeed")  # the logger DeepSpeed creates at its import
    if not any(isinstance(f, _DropCpuAccelerator) for f in deepspeed_logger.filters):
        deepspeed_logger.addFilter(_DropCpuAccelerator())
