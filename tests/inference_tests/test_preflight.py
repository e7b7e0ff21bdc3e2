"""Which endpoint gets which key, and when a tokenizer counts as loadable: checked before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.service.errors import ValidationFailed
from rlctl.service.inference_tests import preflight
from rlctl.service.settings import Settings


def settings(**values: object) -> Settings:
    return Settings(_env_file=None, **values)


def test_openrouter_key_goes_to_openrouter_only() -> None:
    keyed = settings(OPENROUTER_API_KEY="sk-or-secret")
    assert preflight.endpoint_key(keyed, "https://openrouter.ai/api/v1") == "sk-or-secret"
    assert preflight.endpoint_key(keyed, "https://OpenRouter.ai:443/api/v1/") == "sk-or-secret"
    assert preflight.endpoint_key(keyed, "http://openrouter.ai/api/v1") is None  # another origin: plain http
    assert preflight.endpoint_key(keyed, "https://openrouter.ai.example.com/v1") is None
    assert preflight.endpoint_key(keyed, "http://127.0.0.1:8000/v1") is None


def test_a_missing_key_for_a_keyed_endpoint_is_a_conflict() -> None:
    with pytest.raises(preflight.InferenceKeyMissing) as raised:
        preflight.endpoint_key(settings(), "https://openrouter.ai/api/v1")
    assert raised.value.status_code == 409 and raised.value.details["missing"] == "OPENROUTER_API_KEY"
    custom = settings(inference_base_url="https://llm.internal:9000/v1")
    with pytest.raises(preflight.InferenceKeyMissing, match="RLCTL_INFERENCE_API_KEY"):
        preflight.endpoint_key(custom, "https://llm.internal:9000/v1")


def test_the_custom_key_goes_to_its_own_origin_only() -> None:
    custom = settings(inference_base_url="https://llm.internal:9000/v1", inference_api_key="sk-custom")
    assert preflight.endpoint_key(custom, "https://llm.internal:9000/other/v1") == "sk-custom"
    assert preflight.endpoint_key(custom, "https://llm.internal:9001/v1") is None
    assert preflight.endpoint_key(custom, "http://llm.internal:9000/v1") is None


@pytest.mark.parametrize(
    "url", ["ftp://host/v1", "http://", "http://user:pw@host/v1", "https://host:99999/v1", "http://host:0/v1", "x"]
)
def test_base_urls_must_be_plain_http(url: str) -> None:
    with pytest.raises(ValidationFailed):
        preflight.validate_base_url(url)


def test_tokenizer_directories(tmp_path: Path) -> None:
    assert "does not exist" in (preflight.tokenizer_problem(str(tmp_path / "missing")) or "")
    assert "holds no tokenizer" in (preflight.tokenizer_problem(str(tmp_path)) or "")
    (tmp_path / "tokenizer.json").write_text("{}")
    assert preflight.tokenizer_problem(str(tmp_path)) is None


def test_an_uncached_hub_tokenizer_offline_is_a_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    problem = preflight.tokenizer_problem("rlctl-test/no-such-tokenizer")
    assert problem is not None and "offline" in problem
    with pytest.raises(preflight.TokenizerUnavailable, match="RLCTL_TOKENIZER_NAME"):
        preflight.require_tokenizer("rlctl-test/no-such-tokenizer")
