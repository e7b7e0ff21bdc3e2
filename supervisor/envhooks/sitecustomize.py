"""Loaded at start-up by environment processes that rlctl launches (their PYTHONPATH names this folder).

It copies what an Atropos environment logs (`train/percent_correct`, `eval/percent_correct`, ...) to the
append-only file in RLCTL_ENV_METRICS_PATH, so the control plane sees environment metrics with or without
W&B. Any environment works unchanged: the hook wraps `BaseEnv.wandb_log`, which every environment reaches.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any


def _install() -> None:
    path = os.environ.get("RLCTL_ENV_METRICS_PATH")
    if not path:
        return
    try:
        from atroposlib.envs.base import BaseEnv
    except Exception:  # noqa: BLE001 - not an Atropos process after all: nothing to hook
        return
    original = BaseEnv.wandb_log

    async def wandb_log(self: BaseEnv, wandb_metrics: dict[str, Any] | None = None) -> None:
        if wandb_metrics:
            _append(path, getattr(self, "curr_step", 0), wandb_metrics)
        return await original(self, wandb_metrics)

    BaseEnv.wandb_log = wandb_log


def _append(path: str, step: int, metrics: dict[str, Any]) -> None:
    numbers = {
        str(k): float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }
    if not numbers:
        return
    line = json.dumps({"step": int(step), "time": time.time(), "metrics": numbers}) + "\n"
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line)


_install()
