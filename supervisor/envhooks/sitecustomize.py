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
    _guard_wandb_init()


def _guard_wandb_init() -> None:
    """W&B never fails the environment: a `wandb.init` that fails online (W&B unreachable, the key rejected,
    WANDB_INIT_TIMEOUT spent) starts offline instead, and one that cannot start offline either is disabled."""
    if os.environ.get("WANDB_MODE") in ("offline", "disabled"):
        return
    try:
        import wandb
    except Exception:  # noqa: BLE001 - no W&B: nothing to guard
        return
    original = wandb.init

    def init(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - W&B is a mirror: offline, never a crash
            print(f"rlctl: W&B could not start online ({type(error).__name__}: {error}); logging offline", flush=True)
        try:
            return original(*args, **{**kwargs, "mode": "offline"})
        except Exception as error:  # noqa: BLE001
            print(f"rlctl: W&B could not start offline ({type(error).__name__}: {error}); disabled", flush=True)
        return original(*args, **{**kwargs, "mode": "disabled"})

    wandb.init = init


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
