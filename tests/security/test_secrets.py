"""Every configured secret is in one list (SECRET_SETTINGS), which every child's environment and every text the
service answers or logs is scrubbed against, copies of it included (reversed, base64).

Attacked before: RLCTL_JUDGE_API_KEY was missing from the list, so every environment-import child got it, and a
failed PUT /environments/{name} answered the import's traceback unscrubbed (a probe got 8 secrets back)."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import SecretStr

from rlctl.service.environments.catalog import child_process_environment
from rlctl.service.observability import Scrubber, SecretScrubber
from rlctl.service.settings import BUILTIN_ENVIRONMENTS_DIR, SECRET_ENV_NAMES, SECRET_SETTINGS, Settings
from tests.datasets_api.chat_server import chat_server
from tests.support.live import in_process_service, live_service
from tests.support.waiting import scaled, wait_until

SECRETS = {
    "api_token": "admin-secret-token-5150aa",
    "tinker_api_key": "tinker-secret-8086bb",
    "wandb_api_key": "wandb-secret-6502cc",
    "openrouter_api_key": "sk-or-secret-z80dd",
    "summary_api_key": "summary-secret-68000ee",
    "judge_api_key": "judge-secret-6809ff",
    "collection_api_key": "collection-secret-4004gg",
    "inference_api_key": "inference-secret-8008hh",
}


def copies(secret: str) -> list[str]:
    """The copies an attacker would print: reversed, and base64 (standard, URL-safe) at each offset in a text."""
    found = [secret, secret[::-1]]
    for prefix in ("", "a", "ab"):
        raw = f"{prefix}Bearer {secret} end".encode()
        found += [base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()]
    return found


def test_every_secret_setting_is_in_the_one_list() -> None:
    secret_fields = {
        name for name, field in Settings.model_fields.items() if SecretStr in getattr(field.annotation, "__args__", ())
    }
    assert secret_fields == set(SECRET_SETTINGS) == set(SECRETS)
    assert "RLCTL_JUDGE_API_KEY" in SECRET_ENV_NAMES
    assert {"TINKER_API_KEY", "WANDB_API_KEY", "OPENROUTER_API_KEY", "RLCTL_API_TOKEN"} <= SECRET_ENV_NAMES


def test_children_get_no_secret_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SECRET_ENV_NAMES:
        monkeypatch.setenv(name, f"value-of-{name}")
    monkeypatch.setenv("RLCTL_SOMETHING_PLAIN", "kept")
    environment = child_process_environment(set(SECRET_ENV_NAMES))
    assert not SECRET_ENV_NAMES & set(environment)
    assert environment["RLCTL_SOMETHING_PLAIN"] == "kept"


def test_the_scrubber_catches_reversed_and_base64_copies() -> None:
    scrub = Scrubber(SECRETS.values())
    for secret in SECRETS.values():
        for copy in copies(secret):
            text = f"before {copy} after"
            assert "***" in scrub(text), copy
            assert copy not in scrub(text)
    harmless = "an ordinary line with base64 aGVsbG8gd29ybGQ= and words"
    assert scrub(harmless) == harmless


def test_log_lines_are_scrubbed_of_copies(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("rlctl.test.secrets")
    scrubber = SecretScrubber(SECRETS.values())
    logger.addFilter(scrubber)
    try:
        with caplog.at_level(logging.INFO, logger="rlctl.test.secrets"):
            for secret in SECRETS.values():
                for copy in copies(secret):
                    logger.info("leaked %s", copy)
    finally:
        logger.removeFilter(scrubber)
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert logged.count("***") >= len(SECRETS) * 8
    for secret in SECRETS.values():
        assert all(copy not in logged for copy in copies(secret))


def test_a_failed_environment_import_answers_no_secret(make_settings: Callable[..., Settings], tmp_path: Path) -> None:
    """Environment code may learn the service's secrets (its .env file, its parent's environment): here it reads
    them from a file, and its import fails printing them, plain and encoded, and its own environment's judge key."""
    leaked = tmp_path / "leaked.json"
    leaked.write_text(json.dumps(SECRETS))
    echo = (BUILTIN_ENVIRONMENTS_DIR / "echo.py").read_text().replace('name = "echo"', 'name = "leaky"')
    source = echo.replace(
        "\nimport ",
        "\nimport base64 as _b64, json as _json, os as _os, sys as _sys\n"
        f"_secrets = list(_json.load(open({str(leaked)!r})).values())\n"
        "_secrets.append(_os.environ.get('RLCTL_JUDGE_API_KEY', 'judge key absent'))\n"
        "_copies = [c for s in _secrets for c in (s, s[::-1], _b64.b64encode(('x' + s).encode()).decode())]\n"
        "print(' '.join(_copies), file=_sys.stderr)\n"
        "raise RuntimeError('failed with ' + ' '.join(_copies))\n"
        "import ",
        1,
    )
    settings = make_settings(**SECRETS)
    with live_service(settings) as live, live.client(token=SECRETS["api_token"]) as admin:
        refused = admin.put("/environments/leaky", json={"source": source})
    assert refused.status_code == 422, refused.text
    answers = refused.text
    assert "failed with" in refused.text and "***" in refused.text
    for secret in SECRETS.values():
        assert all(copy not in answers for copy in (secret, secret[::-1])), secret
        assert base64.b64encode(("x" + secret).encode()).decode()[4:12] not in answers


def test_a_secret_in_a_collections_prompts_is_kept_nowhere(make_settings: Callable[..., Settings]) -> None:
    """A caller wrote a configured key into a collection's system prompt and a prompt's fields: it is `***` in the
    collection's parameters (answers, database, files), its dataset's parameters and records, and what the model
    got."""
    secret = SECRETS["openrouter_api_key"]
    reply = {"content": "<think>fine</think>The answer is 5."}
    with chat_server(lambda body: (200, reply)) as model:
        settings = make_settings(openrouter_api_key=secret)
        with in_process_service(settings) as live, live.client() as client:
            body = {
                "name": "leaky-prompt",
                "prompts": [{"prompt": "Add 2 and 3.", "answer": "5", "note": f"key {secret}"}],
                "system_prompt": f"Use the key {secret} (reversed: {secret[::-1]}) to answer.",
                "base_url": model.base_url,
                "model": "scripted",
                "max_turns": 1,
            }
            created = client.post("/collections", json=body)
            assert created.status_code == 202, created.text
            collection_id = created.json()["id"]
            done = wait_until(
                lambda: (
                    (found := client.get(f"/collections/{collection_id}").json())["status"] in ("completed", "failed")
                    and found
                ),
                timeout=scaled(120),
                message="the collection ends",
            )
            assert done["status"] == "completed", done
            dataset = client.get(f"/datasets/{done['dataset_id']}").json()
            records = client.get(f"/datasets/{done['dataset_id']}/records").text
            answers = json.dumps(done) + json.dumps(dataset) + records
        stored = "".join(
            path.read_text(errors="replace")
            for path in settings.data_path.rglob("*")
            if path.is_file()
            if path.suffix in (".json", ".jsonl")
        )
    assert "Use the key ***" in json.dumps(done["params"])
    for text in (answers, stored, json.dumps(model.requests)):
        assert secret not in text and secret[::-1] not in text
    assert any("Use the key ***" in json.dumps(request["messages"]) for request in model.requests)
