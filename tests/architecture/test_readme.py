"""The README cannot drift from the code: its tool list is the tool catalogue, its settings table the settings
model, and its command-line section the CLI's parser (its curl flows run in tests/ops/test_readme_flows.py)."""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Iterator

import pytest
from pydantic import AliasChoices

from rlctl.service.cli import build_parser
from rlctl.service.settings import Settings
from rlctl.service.tools.catalog import ALL_TOOLS
from tests.architecture.layers import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text(encoding="utf-8")


def section(heading: str) -> str:
    start = README.index(f"\n## {heading}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else None]


def test_the_tool_list_is_the_catalogue() -> None:
    match = re.search(r"The (\d+) tools: (.*?)\. The selected environment", README, re.S)
    assert match, "the README's tool list ('The N tools: ...') is missing"
    listed = re.findall(r"`(rl_[a-z_]+)`", match.group(2))
    assert sorted(listed) == sorted(tool.name for tool in ALL_TOOLS)
    assert int(match.group(1)) == len(ALL_TOOLS) == len(listed)


def environment_names(name: str) -> set[str]:
    """The variables that set the field `name`: its aliases, else RLCTL_ + its name."""
    alias = Settings.model_fields[name].validation_alias
    if isinstance(alias, AliasChoices):
        return {str(choice).upper() for choice in alias.choices}
    if isinstance(alias, str):
        return {alias.upper()}
    return {f"{Settings.model_config.get('env_prefix', '')}{name}".upper()}


def settings_table_names() -> list[str]:
    rows = [line for line in section("Settings").splitlines() if line.startswith("| `")]
    return [name for row in rows for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", row.split(" | ")[0])]


def test_the_settings_table_is_the_settings_model() -> None:
    listed = settings_table_names()
    assert len(listed) == len(set(listed)), "a variable is listed twice"
    missing = [name for name in Settings.model_fields if not environment_names(name) & set(listed)]
    assert missing == [], f"settings missing from the README's table: {missing}"
    known = set().union(*(environment_names(name) for name in Settings.model_fields))
    assert [name for name in listed if name not in known] == [], "the table lists variables no setting reads"


def leaf_commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> Iterator[str]:
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subcommands:
        yield " ".join(prefix)
        return
    for name, child in subcommands[0].choices.items():
        yield from leaf_commands(child, (*prefix, name))


def readme_command_lines() -> list[list[str]]:
    lines = []
    for block in re.findall(r"```sh\n(.*?)```", section("Command line"), re.S):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["rlctl"]:
                lines.append(words[1:])
    return lines


def test_the_command_line_section_shows_every_command_and_each_line_parses() -> None:
    parser = build_parser()
    commands = set(leaf_commands(parser))
    shown = set()
    for words in readme_command_lines():
        try:
            parser.parse_args(words)
        except SystemExit:
            pytest.fail(f"the README's `rlctl {' '.join(words)}` does not parse")
        shown.add(next(c for c in sorted(commands, key=len, reverse=True) if words[: len(c.split())] == c.split()))
    assert sorted(commands - shown) == [], "commands the README's command-line section does not show"
