"""GSM8K's answer parsing and scoring, on hand-written cases and the real data set."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, TEST_DATA


def load_environment_module(name: str):  # type: ignore[no-untyped-def]
    path = REPO_ROOT / "environments" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"env_{name}", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


gsm8k = load_environment_module("gsm8k")


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("So the total is \\boxed{72}.", "72"),
        ("\\boxed{1,234}", "1234"),
        ("\\boxed{\\$18.00}", "18"),
        ("\\boxed{\\frac{1}{2}} no wait \\boxed{3/4}", "0.75"),
        ("Work...\n#### 42", "42"),
        ("The answer is: $5.50.", "5.5"),
        ("first 3 apples then 7 apples, 10 in all", "10"),
        ("<think>maybe \\boxed{5}</think> Final: \\boxed{6}", "6"),
        ("<think>still thinking about \\boxed{5}", None),
        ("no numbers here", None),
        ("\\boxed{-3}", "-3"),
    ],
)
def test_extract_answer(completion: str, expected: str | None) -> None:
    assert gsm8k.extract_answer(completion) == expected


def test_score_is_one_for_the_right_answer_and_zero_otherwise() -> None:
    assert gsm8k.score_completion("\\boxed{72}", "72") == 1.0
    assert gsm8k.score_completion("\\boxed{72.0}", "72") == 1.0
    assert gsm8k.score_completion("\\boxed{73}", "72") == 0.0
    assert gsm8k.score_completion("", "72") == 0.0
    assert gsm8k.score_completion("\\boxed{72}", None) == 0.0


def test_every_real_reference_solution_scores_one_against_its_own_answer() -> None:
    rows = [json.loads(line) for line in (TEST_DATA / "gsm8k" / "test.jsonl").read_text().splitlines()]
    assert len(rows) == 100  # the excerpt's test rows
    for row in rows:
        gold = gsm8k.gold_answer(row["answer"])
        assert gold is not None, row["answer"]
        # The reference solution itself ends with "#### N": parsing it must recover the gold answer.
        assert gsm8k.score_completion(row["answer"], gold) == 1.0, row["answer"]


def test_local_data_set_is_read_from_rlctl_gsm8k_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLCTL_GSM8K_PATH", str(TEST_DATA / "gsm8k"))
    train = gsm8k.load_split("train")
    assert len(train) == 150 and {"question", "answer"} <= set(train[0])


def test_config_init_differs_from_class_defaults() -> None:
    config, [server] = gsm8k.GSM8KEnv.config_init()
    assert config.group_size == 16 and config.batch_size == 128
    assert server.server_type == "sglang" and server.health_check is False
    assert Path(gsm8k.__file__).name == "gsm8k.py"
