"""Loaded at start-up by environment processes that rlctl launches (their PYTHONPATH names this folder).

It copies what an Atropos environment logs (`train/percent_correct`, `eval/percent_correct`, ...) to the
append-only file in RLCTL_ENV_METRICS_PATH, so the control plane sees environment metrics with or without
W&B. Any environment works unchanged: the hook wraps `BaseEnv.wandb_log`, which every environment reaches. With
RLCTL_ENV_METRICS_PREFIX set (an environment of a mixed run), each metric is also copied under that prefix.
atroposlib logs an environment's metrics only when the environment sees the trainer's step change, so the groups
sent after its last look would never be counted when the run ends (a judge's calls, the last groups' scores): on
SIGTERM (the run stopping, whatever the reason), and when its loop ends (atroposlib ends it once the trainer has
its steps), an environment that has sent groups since its last log logs once more, to this file only (W&B is not
called while the process is going); at SIGTERM it then dies of the signal as before.

The environment is started beside the run's Atropos API and trainer, not after them (docs/RUNS.md#process-order):
with RLCTL_ENV_API_WAIT_S set, `BaseEnv.register_env` first waits up to that many seconds for the trainer to have
registered with the API, so atroposlib's registration is never spent on an API that is still starting, and succeeds
at once instead of answering "wait for trainer to start" and sleeping a second before it asks again. (An attempt
told to wait in the moment between the trainer's registration and its first batch request is made again 0.1 s
later.)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from typing import Any

API_PROBE_INTERVAL_S = 0.1
WAIT_FOR_TRAINER = "wait for trainer to start"  # the Atropos API's answer to an environment it does not let in yet
RUN_KEY_ENV = "RLCTL_RUN_INFERENCE_KEY"  # rlctl.trainer.inference_guard.KEY_ENV (this hook imports nothing of rlctl)
RUN_KEY_PLACEHOLDER = "local"  # the `api_key` of the run config's inference server (run_config.py)
FLUSH_TIMEOUT_S = 2.0  # the last log's limit: well inside the supervisor's grace before SIGKILL
UNLOGGED = "_rlctl_sent_since_log"  # whether an environment has sent groups since its last log
FLUSHING = "_rlctl_flushing"  # set during the last log: the file only, not W&B
LAST_LOG = "_rlctl_last_log"  # the task of the last log after a SIGTERM (held: the loop keeps tasks weakly)


def _install() -> None:
    path = os.environ.get("RLCTL_ENV_METRICS_PATH")
    if not path:
        return
    try:
        from atroposlib.envs.base import BaseEnv
    except Exception:  # noqa: BLE001 - not an Atropos process after all: nothing to hook
        return
    _copy_metrics(BaseEnv, path)
    _log_once_more_at_stop(BaseEnv)
    _use_the_run_key()
    _wait_for_the_api(BaseEnv)
    _guard_wandb_init()


def _copy_metrics(base_env: Any, path: str) -> None:
    """What an environment logs (its `wandb_log` adds its metrics, then calls the base's) goes to `path` too."""
    original = base_env.wandb_log

    async def wandb_log(self: Any, wandb_metrics: dict[str, Any] | None = None) -> None:
        if wandb_metrics:
            _append(path, getattr(self, "curr_step", 0), wandb_metrics)
        setattr(self, UNLOGGED, False)
        if not getattr(self, FLUSHING, False):
            await original(self, wandb_metrics)

    base_env.wandb_log = wandb_log


def _log_once_more_at_stop(base_env: Any) -> None:
    """Notes the groups sent since the last log, and logs them as the environment ends (the module's docstring)."""
    original_send, original_manager = base_env.handle_send_to_api, base_env.env_manager

    async def handle_send_to_api(self: Any, *args: Any, **kwargs: Any) -> Any:
        answer = await original_send(self, *args, **kwargs)
        setattr(self, UNLOGGED, True)
        return answer

    async def env_manager(self: Any) -> Any:
        loop = asyncio.get_running_loop()
        # off the main thread no handler can be set: SIGTERM then ends the process at once, as before
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGTERM, functools.partial(_stopping, self, loop))
        try:
            return await original_manager(self)
        finally:  # its loop ends once the trainer has its steps: the process then exits
            await _last_log(self)

    base_env.handle_send_to_api = handle_send_to_api
    base_env.env_manager = env_manager


def _stopping(env: Any, loop: asyncio.AbstractEventLoop, _signal: int, _frame: Any) -> None:
    """SIGTERM: the last log on the environment's loop, then the signal's own end; at most FLUSH_TIMEOUT_S later
    whatever the loop is doing (a Python handler runs between two bytecodes, not when the loop next turns)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    deadline = threading.Timer(FLUSH_TIMEOUT_S, os.kill, (os.getpid(), signal.SIGTERM))
    deadline.daemon = True
    deadline.start()
    loop.call_soon_threadsafe(lambda: setattr(env, LAST_LOG, loop.create_task(_log_then_die(env))))


async def _log_then_die(env: Any) -> None:
    try:
        await _last_log(env)
    finally:
        os.kill(os.getpid(), signal.SIGTERM)


async def _last_log(env: Any) -> None:
    """The groups sent since the environment's last log, logged to the file only (the process is ending)."""
    if not getattr(env, UNLOGGED, False):
        return
    setattr(env, FLUSHING, True)
    try:
        await asyncio.wait_for(env.wandb_log({}), FLUSH_TIMEOUT_S)
    except Exception as error:  # noqa: BLE001 - the process is ending either way
        print(f"rlctl: the environment's last metrics were not logged ({type(error).__name__}: {error})", flush=True)


def _use_the_run_key() -> None:
    """The run's config names the inference server's key as RUN_KEY_PLACEHOLDER (the key is in no file): each
    server config that does gets the key of this process's environment, before atroposlib builds its clients."""
    key = os.environ.get(RUN_KEY_ENV)
    if not key:
        return
    try:
        from atroposlib.envs.server_handling.server_manager import ServerManager
    except Exception:  # noqa: BLE001 - an atroposlib without it: its clients keep the placeholder
        return
    original = ServerManager.__init__

    def init(self: Any, configs: Any, *args: Any, **kwargs: Any) -> None:
        for config in configs if isinstance(configs, list) else [configs]:
            if getattr(config, "api_key", None) == RUN_KEY_PLACEHOLDER:
                config.api_key = key
        original(self, configs, *args, **kwargs)

    ServerManager.__init__ = init


def _wait_for_the_api(base_env: Any) -> None:
    wait_s = float(os.environ.get("RLCTL_ENV_API_WAIT_S") or 0)
    if wait_s <= 0:
        return
    original, original_attempt = base_env.register_env, base_env._register_env

    async def register_env(self: Any) -> Any:
        url = str(self.config.rollout_server_url).rstrip("/")
        deadline = time.monotonic() + wait_s
        while not await asyncio.to_thread(trainer_registered, url) and time.monotonic() < deadline:
            await asyncio.sleep(API_PROBE_INTERVAL_S)
        return await original(self)  # past the deadline too: atroposlib's own attempts then report it

    async def register_attempt(self: Any) -> Any:
        # The API lets environments in at the trainer's first batch request, which follows its registration at
        # once: an attempt in between is told to wait, changes nothing, and is made again here after 0.1 s rather
        # than after atroposlib's second.
        deadline = time.monotonic() + wait_s
        answer = await original_attempt(self)
        while _told_to_wait(answer) and time.monotonic() < deadline:
            await asyncio.sleep(API_PROBE_INTERVAL_S)
            answer = await original_attempt(self)
        return answer

    base_env.register_env = register_env
    base_env._register_env = register_attempt


def _told_to_wait(answer: Any) -> bool:
    return isinstance(answer, dict) and answer.get("status") == WAIT_FOR_TRAINER


def trainer_registered(api_url: str) -> bool:
    """Whether a trainer has registered with the Atropos API at `api_url`: its `/info` then gives the trainer's
    batch size instead of -1 (the trainer asks for its first batch right after, which lets environments in)."""
    try:
        with urllib.request.urlopen(f"{api_url}/info", timeout=2.0) as response:  # noqa: S310 - the run's loopback API
            info = json.loads(response.read() or b"{}")
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return isinstance(info, dict) and info.get("batch_size", -1) != -1


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
    # A mixed run's environment (rlctl/supervisor/mixture.py): its metrics also under a name of its own, as the
    # unprefixed names of several environments overwrite each other.
    prefix = os.environ.get("RLCTL_ENV_METRICS_PREFIX")
    if prefix:
        numbers.update({f"{prefix}{name}": value for name, value in list(numbers.items())})
    line = json.dumps({"step": int(step), "time": time.time(), "metrics": numbers}) + "\n"
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(line)


_install()
