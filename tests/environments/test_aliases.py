"""Environment names and aliases (docs/ENVIRONMENTS.md#names-and-aliases)."""

from __future__ import annotations

from rlctl.service.environments.catalog import resolve_alias

NAMES = {"gsm8k", "echo", "math_env_tinker"}


def test_a_name_less_a_hermes_suffix_finds_its_environment() -> None:
    assert resolve_alias("gsm8k_tinker", NAMES) == "gsm8k"
    assert resolve_alias("gsm8k-tinker", NAMES) == "gsm8k"
    assert resolve_alias("echo_env", NAMES) == "echo"


def test_an_exact_name_wins_and_unknown_names_find_nothing() -> None:
    assert resolve_alias("math_env_tinker", NAMES) == "math_env_tinker"
    assert resolve_alias("gsm8k", NAMES) == "gsm8k"
    assert resolve_alias("nope_tinker", NAMES) is None
    assert resolve_alias("gsm8k_tinker_tinker", NAMES) is None
