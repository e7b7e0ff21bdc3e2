"""The inference-test request's published URL pattern means the same to a JSON Schema client and to the service."""

from __future__ import annotations

import re

import jsonschema
import pytest
from pydantic import ValidationError

from rlctl.service.inference_tests.schemas import BASE_URL_PATTERN, CreateInferenceTestRequest

ACCEPTED = ["http://127.0.0.1:8000/v1", "https://openrouter.ai/api/v1", "http://host/a%C3%A9?x=1"]
# U+0085 is whitespace to Python's `\s` and not to a JSON Schema regex: the pattern must not depend on either.
REFUSED = ["http://host/v1 x", "http://host/a\u0085b", "http://host/é", "ftp://host/v1", "http://host/a\tb"]


@pytest.mark.parametrize("url", ACCEPTED + REFUSED)
def test_the_service_and_the_published_schema_agree_on_base_urls(url: str) -> None:
    schema = {"type": "string", "pattern": BASE_URL_PATTERN}
    published = jsonschema.Draft202012Validator(schema).is_valid(url)
    try:
        CreateInferenceTestRequest(environment="echo", base_url=url)
        service = True
    except ValidationError:
        service = False
    assert published == service == (url in ACCEPTED), (url, published, service)
    assert bool(re.search(BASE_URL_PATTERN, url)) == service
