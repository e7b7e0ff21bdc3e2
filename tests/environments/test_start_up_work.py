"""The start-up work (docs/RUNS.md#start-up-work): every schema read at start in one child per directory and kept
on disk, the tiny model built in a child, and no child left behind by a stopped service."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest
from fastapi import FastAPI

from rlctl.service.environments.catalog import EnvironmentCatalog
from rlctl.service.runs.tiny_model import TinyModelBuilder
from tests.conftest import build_settings
from tests.support.live import in_process_service
from tests.support.waiting import wait_until

# About the import itself: nothing may come from the session's shared schemas.
pytestmark = pytest.mark.real_introspection

EXTRA_ENV = textwrap.dedent(
    """
    from atroposlib.envs.base import BaseEnv, BaseEnvConfig
    from pydantic import Field


    class ExtraConfig(BaseEnvConfig):
        difficulty: int = Field(1, ge=1, le=10)


    class ExtraEnv(BaseEnv):
        name = "extra"
        env_config_cls = ExtraConfig

        @classmethod
        def config_init(cls):
            return ExtraConfig(difficulty=DIFFICULTY, group_size=4, batch_size=16), []
    """
)


def _extra(directory: Path, difficulty: int) -> None:
    (directory / "extra.py").write_text(EXTRA_ENV.replace("DIFFICULTY", str(difficulty)))


def _settings(tmp_path: Path, extra: Path, **overrides: object):  # type: ignore[no-untyped-def]
    values = {"environment_dirs": str(extra), "warm_up": True, "local_base_model": "unused-here", **overrides}
    return build_settings(tmp_path / "var", f"sqlite:///{tmp_path / 'rlctl.db'}", tiny_model=False, **values)


def _difficulty(client) -> int:  # type: ignore[no-untyped-def]
    fields = client.get("/environments/extra").json()["configurable_fields"]
    return next(f["default"] for f in fields if f["name"] == "difficulty")


def test_schemas_are_read_at_start_kept_on_disk_and_read_back_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    extra = tmp_path / "extra"
    extra.mkdir()
    _extra(extra, 7)
    (extra / "broken.py").write_text("raise RuntimeError('boom at import')\nclass Broken(BaseEnv):\n    pass\n")
    settings = _settings(tmp_path, extra)
    store = settings.schema_store_dir
    with in_process_service(settings) as live, live.client() as client:
        # the shipped environments and `extra`; `broken` is never stored
        environments, _ = EnvironmentCatalog.of(live.app.state.context).discover()
        importable = len([env for env in environments if env.name != "broken"])
        wait_until(
            lambda: len(list(store.glob("*.json"))) >= importable, timeout=180, message="schemas stored at start"
        )
        assert _difficulty(client) == 7
        response = client.get("/environments/broken")
        assert response.status_code == 422 and "boom at import" in response.json()["error"]["message"]
    assert len(list(store.glob("*.json"))) == importable

    def no_child(*args: object) -> None:
        raise AssertionError("a restarted service imported an environment it had stored")

    with monkeypatch.context() as patched:
        patched.setattr(EnvironmentCatalog, "_introspect", no_child)
        patched.setattr(EnvironmentCatalog, "_introspect_many", no_child)
        with in_process_service(_settings(tmp_path, extra, warm_up=False)) as live, live.client() as client:
            assert _difficulty(client) == 7
            assert client.get("/environments/gsm8k").status_code == 200

    _extra(extra, 8)  # new content, new key: imported again
    with in_process_service(_settings(tmp_path, extra, warm_up=False)) as live, live.client() as client:
        assert _difficulty(client) == 8


def test_a_stopped_service_leaves_no_warm_up_child(tmp_path: Path) -> None:
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "hangs.py").write_text("import time\ntime.sleep(600)\nclass Hangs(BaseEnv):\n    pass\n")
    settings = _settings(tmp_path, extra, schema_timeout_s=600)

    def batch_children() -> list[psutil.Process]:
        return [
            p
            for p in psutil.Process().children(recursive=True)
            if "rlctl.service.environments.introspect" in " ".join(p.cmdline()) and "--batch" in p.cmdline()
        ]

    with in_process_service(settings):
        children = wait_until(batch_children, timeout=60, message="a warm-up child")
    gone, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, f"warm-up children outlived the service: {alive}"


def test_the_tiny_model_is_built_at_start_in_a_child(tmp_path: Path) -> None:
    extra = tmp_path / "extra"
    extra.mkdir()
    settings = _settings(tmp_path, extra, local_base_model=None)
    children_run: list[list[str]] = []

    def record_children(app: FastAPI) -> None:
        # The build is a child of the service's ChildRunner; forked from a warm fork server it lasts a fraction of
        # a second, too short to be seen reliably in the process table, so the runner's calls are recorded.
        runner = app.state.context.children
        run = runner.run

        def recorded(argv: list[str], **kwargs: Any) -> Any:
            children_run.append(list(argv))
            return run(argv, **kwargs)

        runner.run = recorded

    with in_process_service(settings, prepare=record_children) as live:
        wait_until(TinyModelBuilder.of(live.app.state.context).built, timeout=180, message="the tiny model built")
        assert (settings.tiny_model_dir / "config.json").exists()
    assert [argv[1:3] for argv in children_run if "rlctl.trainer.tiny_model" in argv] == [
        ["-m", "rlctl.trainer.tiny_model"]
    ]
