"""The excerpts of real public trajectories (tests/data/SOURCES.md): what each must import as, and an importer."""

from __future__ import annotations

from pathlib import Path

from rlctl.trajectories.importing import ImportedRecord, import_items
from rlctl.trajectories.reading import ItemError, read_items

# Every data file and the format auto-detection must give it, with its record count.
EXPECTED_FILES: dict[str, tuple[str, int]] = {
    "hermes-agent-fork-lucifexia-trajectory-samples.jsonl": ("sharegpt", 1),
    "llamafactory-glaive-toolcall-en-demo.json": ("sharegpt", 12),
    "llamafactory-reason-tool-use-demo-50.jsonl": ("llamafactory", 8),
    "mini-swe-agent-github-issue.traj.json": ("openai", 1),
    "nemo-gym-anyswe-hermes-rollouts.jsonl": ("responses", 1),
    "nemo-gym-anyterminal-hermes-rollouts.jsonl": ("responses", 2),
    "nemo-gym-conversational-tool-use-rollouts.jsonl": ("responses", 1),
    "nemo-gym-mini-swe-agent-2-rollouts.jsonl": ("responses", 2),
    "nemo-gym-newton-bench-rollouts.jsonl": ("responses", 3),
    "nemo-gym-xlam-fc-rollouts.jsonl": ("responses", 5),
    "openhands-multi-swe-bench-output.jsonl": ("openhands", 2),
    "openhands-sdk-fncall-messages.json": ("openai", 1),
    "openhands-sdk-llm-log-claude-sonnet-4.json": ("openai", 1),
    "openhands-sdk-llm-log-deepseek-nonfncall.json": ("openai", 1),
    "openhands-sdk-nonfncall-messages.json": ("openai", 1),
    "swe-agent-function-calling-simple.traj": ("swe_agent", 1),
    "swe-agent-marshmallow-1867-function-calling.traj": ("swe_agent", 1),
    "swe-agent-pydicom-1458.traj": ("swe_agent", 1),
    "tau-bench-gpt-4o-airline.json": ("tau_bench", 11),
}


def import_file(path: Path, fmt: str = "auto") -> list[ImportedRecord | ItemError]:
    with path.open(encoding="utf-8") as lines:
        return list(import_items(read_items(lines), fmt=fmt))
