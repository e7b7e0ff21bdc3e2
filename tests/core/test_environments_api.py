"""The environment catalog over HTTP: listing, details, config preview, and every kind of bad input."""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import build_settings
from tests.support.live import Service, in_process_service

# These tests are about importing environments: each app imports them itself, never from the session's results.
pytestmark = pytest.mark.real_introspection

EXTRA_ENV = textwrap.dedent(
    '''
    from atroposlib.envs.base import BaseEnv, BaseEnvConfig
    from pydantic import Field


    class ExtraConfig(BaseEnvConfig):
        difficulty: int = Field(1, ge=1, le=10, description="How hard the puzzles are.")


    class ExtraEnv(BaseEnv):
        """An environment from an extra directory."""

        name = "extra"
        env_config_cls = ExtraConfig

        @classmethod
        def config_init(cls):
            return ExtraConfig(difficulty=7, group_size=4, batch_size=16), []
    '''
)


@pytest.fixture(scope="module")
def extra_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("extra_envs")
    (directory / "extra.py").write_text(EXTRA_ENV)
    return directory


@pytest.fixture(scope="module")
def catalog_service(tmp_path_factory: pytest.TempPathFactory, extra_dir: Path) -> Iterator[Service]:
    data_dir = tmp_path_factory.mktemp("var")
    settings = build_settings(
        data_dir, f"sqlite:///{data_dir / 'rlctl.db'}", environment_dirs=str(extra_dir), api_token="test-token"
    )
    with in_process_service(settings) as live:
        yield live


@pytest.fixture
def client(catalog_service: Service) -> Iterator[httpx.Client]:
    with catalog_service.client(token="test-token") as client:
        yield client


def error_code(response: httpx.Response) -> str:
    return response.json()["error"]["code"]


def test_lists_the_shipped_environments(client: httpx.Client) -> None:
    body = client.get("/environments").json()
    names = [e["name"] for e in body["environments"]]
    assert "gsm8k" in names and "extra" in names
    assert names == sorted(names)
    assert body["count"] == len(names)
    gsm8k = next(e for e in body["environments"] if e["name"] == "gsm8k")
    assert gsm8k["class_name"] == "GSM8KEnv"
    assert gsm8k["config_class"] == "GSM8KConfig"
    assert gsm8k["file_path"].endswith("environments/gsm8k.py")
    assert gsm8k["description"].startswith("Grade-school math")
    # the dataset environments are listed (an agent selects them for a dataset run) but marked: not by name
    marked = {e["name"] for e in body["environments"] if not e["trainable_by_name"]}
    assert marked == {"dataset_offline", "dataset_online"}


def test_gsm8k_shows_locked_spec_defaults_and_config_init_values(client: httpx.Client) -> None:
    body = client.get("/environments/gsm8k", params={"backend": "tinker"}).json()
    locked = {f["name"]: f["value"] for f in body["locked_fields"]}
    assert locked["tokenizer_name"] == "Qwen/Qwen3-8B"
    assert locked["total_steps"] == 2500 and locked["learning_rate"] == 4e-5
    assert locked["save_checkpoint_interval"] == 25
    assert locked["kl_coef"] == 0.0 and locked["lora_alpha"] is None  # what Tinker cannot honour
    configurable = {f["name"]: f for f in body["configurable_fields"]}
    # the training options: the operator's values are the defaults (docs/TRAINER.md#training-options)
    assert configurable["lora_rank"]["default"] == 32 and configurable["max_token_length"]["default"] == 8192
    assert configurable["loss_fn"]["default"] == "importance_sampling"
    assert configurable["group_size"]["default"] == 16  # config_init(); the class default is 4
    assert configurable["batch_size"]["default"] == 128  # config_init(); the class default is -1
    assert configurable["max_new_tokens"]["type"] == "int"
    assert configurable["wandb_project"]["default"] == "atropos-tinker"
    assert not set(locked) & set(configurable)


def test_extra_directory_environment_defaults_come_from_config_init(client: httpx.Client) -> None:
    body = client.get("/environments/extra").json()
    configurable = {f["name"]: f for f in body["configurable_fields"]}
    assert configurable["difficulty"]["default"] == 7
    assert configurable["difficulty"]["description"] == "How hard the puzzles are."
    assert configurable["group_size"]["default"] == 4


def test_preview_merges_edits_and_renders_yaml(client: httpx.Client) -> None:
    response = client.post(
        "/environments/extra/config/preview",
        json={"config": {"difficulty": 3, "group_size": 4, "batch_size": 8}, "backend": "tinker"},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["config"]["env"]["difficulty"] == 3
    assert body["config"]["env"]["total_steps"] == 2500
    assert body["config"]["tinker"]["backend"] == "tinker"
    assert "difficulty: 3" in body["yaml"]


@pytest.mark.parametrize(
    ("edits", "code"),
    [
        ({"total_steps": 5}, "FIELD_LOCKED"),
        ({"learning_rate": 0.1}, "FIELD_LOCKED"),
        ({"kl_coef": 0.1}, "FIELD_LOCKED"),
        ({"loss_fn": "gspo"}, "VALIDATION_ERROR"),
        ({"not_a_field": 5}, "UNKNOWN_FIELD"),
        ({"difficulty": "hard"}, "VALIDATION_ERROR"),
        ({"difficulty": 11}, "VALIDATION_ERROR"),
    ],
)
def test_preview_rejects_bad_edits(client: httpx.Client, edits: dict, code: str) -> None:
    response = client.post("/environments/extra/config/preview", json={"config": edits, "backend": "tinker"})
    assert response.status_code == 422
    assert error_code(response) == code
    assert response.json()["error"]["details"]["field"] == next(iter(edits))


def test_unknown_environment_is_404_with_the_available_names(client: httpx.Client) -> None:
    response = client.get("/environments/nope")
    assert response.status_code == 404
    assert error_code(response) == "ENVIRONMENT_NOT_FOUND"
    assert "gsm8k" in response.json()["error"]["details"]["available"]
    assert client.post("/environments/nope/config/preview", json={"config": {}}).status_code == 404


@pytest.mark.parametrize(
    "path", ["/environments/a..b", "/environments/bad%00name", "/environments/.hidden", "/environments/a.b"]
)
def test_path_like_names_are_refused(client: httpx.Client, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 422
    assert error_code(response) == "INVALID_NAME"


def test_slash_in_a_name_never_reaches_a_file(client: httpx.Client) -> None:
    response = client.get("/environments/..%2F..%2Fetc%2Fpasswd")
    assert response.status_code in (404, 422)
    assert "root:" not in response.text


def test_syntax_error_is_listed_and_the_rest_still_listed(client: httpx.Client, extra_dir: Path) -> None:
    broken = extra_dir / "broken_env.py"
    broken.write_text("class Broken(BaseEnv)\n    pass\n")
    try:
        body = client.get("/environments").json()
        assert any(e["name"] == "broken_env" and "SyntaxError" in e["error"] for e in body["errors"])
        assert {"gsm8k", "extra"} <= {e["name"] for e in body["environments"]}
    finally:
        broken.unlink()
    assert client.get("/environments").json()["errors"] == []


def test_file_added_while_running_is_seen_and_changes_are_picked_up(client: httpx.Client, extra_dir: Path) -> None:
    added = extra_dir / "added_later.py"
    added.write_text('class AddedLater(BaseEnv):\n    """Added while the service runs."""\n')
    try:
        listed = {e["name"]: e for e in client.get("/environments").json()["environments"]}
        assert listed["added_later"]["description"] == "Added while the service runs."
        added.write_text('class AddedLater(BaseEnv):\n    """Changed."""\n    name = "renamed"\n')
        listed = {e["name"]: e for e in client.get("/environments").json()["environments"]}
        assert "added_later" not in listed
        assert listed["renamed"]["description"] == "Changed."
    finally:
        added.unlink()
    assert "renamed" not in {e["name"] for e in client.get("/environments").json()["environments"]}


def test_an_environment_that_fails_to_import_is_a_clear_error(client: httpx.Client, extra_dir: Path) -> None:
    failing = extra_dir / "fails_on_import.py"
    failing.write_text("raise RuntimeError('boom at import')\nclass Fails(BaseEnv):\n    pass\n")
    try:
        response = client.get("/environments/fails_on_import")
        assert response.status_code == 422
        assert error_code(response) == "ENVIRONMENT_LOAD_FAILED"
        assert "boom at import" in response.json()["error"]["message"]
    finally:
        failing.unlink()


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic dGVzdA=="}])
def test_missing_or_wrong_token_is_401(catalog_service: Service, headers: dict) -> None:
    with catalog_service.anonymous(headers) as anonymous:
        response = anonymous.get("/environments")
        assert response.status_code == 401
        assert error_code(response) == "UNAUTHORIZED"
        assert anonymous.get("/healthz").status_code == 200
        assert anonymous.get("/openapi.json").status_code == 200


def test_request_ids_are_returned_and_echoed(client: httpx.Client) -> None:
    response = client.get("/environments/nope", headers={"X-Request-ID": "abc-123"})
    assert response.headers["x-request-id"] == "abc-123"
    assert response.json()["error"]["request_id"] == "abc-123"


def test_oversized_body_is_413_and_changes_nothing(client: httpx.Client) -> None:
    response = client.post("/environments/extra/config/preview", json={"config": {"wandb_name": "x" * (2 << 20)}})
    assert response.status_code == 413
    assert error_code(response) == "PAYLOAD_TOO_LARGE"


def test_malformed_json_is_a_validation_error(client: httpx.Client) -> None:
    response = client.post(
        "/environments/extra/config/preview", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422
    assert error_code(response) == "VALIDATION_ERROR"


def test_an_environment_whose_import_hangs_times_out_clearly(tmp_path: Path) -> None:
    """The config schema comes from a child process with a time-out: a hanging import is an error, not a hang."""
    (tmp_path / "slow.py").write_text("import time\ntime.sleep(600)\nclass Slow(BaseEnv):\n    pass\n")
    settings = build_settings(
        tmp_path / "var", f"sqlite:///{tmp_path / 'rlctl.db'}", environment_dirs=str(tmp_path), schema_timeout_s=2
    )
    with in_process_service(settings) as live, live.client() as client:
        response = client.get("/environments/slow")
        assert response.status_code == 422
        assert response.json()["error"]["code"] == "ENVIRONMENT_LOAD_FAILED"
        assert "longer than 2 s" in response.json()["error"]["message"]
        assert {"slow", "gsm8k"} <= {e["name"] for e in client.get("/environments").json()["environments"]}
    slow_file = str(tmp_path / "slow.py")
    children = [p for p in psutil.process_iter(["cmdline"]) if slow_file in " ".join(p.info["cmdline"] or [])]
    assert not children, "the timed-out child is still running"
