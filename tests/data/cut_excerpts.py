"""Cut the test excerpts in this folder from the full public files (see SOURCES.md).

Run once by a maintainer who holds the full files: `python tests/data/cut_excerpts.py SOURCE_DIR`, where
SOURCE_DIR has `gsm8k/` and `trajectories/` as SOURCES.md names them. Tests never run this; they read only
the excerpts it wrote. Every kept record keeps its original bytes except where CUTS says otherwise.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# Line-per-record files: the 0-based indices of the records kept (in source order).
JSONL_RECORDS: dict[str, list[int]] = {
    "llamafactory-reason-tool-use-demo-50.jsonl": list(range(8)),
    "nemo-gym-anyswe-hermes-rollouts.jsonl": [0],
    "nemo-gym-anyterminal-hermes-rollouts.jsonl": [0, 4],  # 4: 90 tool calls
    "nemo-gym-conversational-tool-use-rollouts.jsonl": [0],
    "nemo-gym-mini-swe-agent-2-rollouts.jsonl": [0, 1],
    "nemo-gym-newton-bench-rollouts.jsonl": [1, 3, 4],  # three different rewards
    "openhands-multi-swe-bench-output.jsonl": [0, 2],  # 2: ponyc-4588, the longest run (103 events)
}
# Files kept whole.
WHOLE = [
    "hermes-agent-fork-lucifexia-trajectory-samples.jsonl",
    "mini-swe-agent-github-issue.traj.json",
    "nemo-gym-xlam-fc-rollouts.jsonl",
    "openhands-sdk-fncall-messages.json",
    "openhands-sdk-llm-log-claude-sonnet-4.json",
    "openhands-sdk-llm-log-deepseek-nonfncall.json",
    "openhands-sdk-nonfncall-messages.json",
    "swe-agent-function-calling-simple.traj",
    "swe-agent-pydicom-1458.traj",
]
TAU_BENCH_TASKS = {0, 1, 48}  # every trial of each: groups of 4, 4 and 3
GLAIVE_RECORDS = 12
GSM8K_ROWS = {"train.jsonl": 150, "test.jsonl": 100}


def cut_jsonl(source: Path, target: Path, keep: list[int]) -> None:
    lines = [line for line in source.read_text(encoding="utf-8").splitlines(keepends=True) if line.strip()]
    target.write_text("".join(lines[index] for index in keep), encoding="utf-8")


def cut_trajectories(source: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for name, keep in JSONL_RECORDS.items():
        cut_jsonl(source / name, target / name, keep)
    for name in WHOLE:
        shutil.copyfile(source / name, target / name)
    tau = json.loads((source / "tau-bench-gpt-4o-airline.json").read_text(encoding="utf-8"))
    kept = [record for record in tau if record["task_id"] in TAU_BENCH_TASKS]
    (target / "tau-bench-gpt-4o-airline.json").write_text(json.dumps(kept, indent=2) + "\n", encoding="utf-8")
    glaive = json.loads((source / "llamafactory-glaive-toolcall-en-demo.json").read_text(encoding="utf-8"))
    glaive_text = json.dumps(glaive[:GLAIVE_RECORDS], indent=2, ensure_ascii=False) + "\n"
    (target / "llamafactory-glaive-toolcall-en-demo.json").write_text(glaive_text, encoding="utf-8")
    # SWE-agent's `trajectory` repeats the state at every step (289 KB); the importer reads `history`.
    marshmallow = json.loads((source / "swe-agent-marshmallow-1867-function-calling.traj").read_text("utf-8"))
    marshmallow.pop("trajectory")
    marshmallow_text = json.dumps(marshmallow, indent=2) + "\n"
    (target / "swe-agent-marshmallow-1867-function-calling.traj").write_text(marshmallow_text, encoding="utf-8")


def cut_gsm8k(source: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for name, rows in GSM8K_ROWS.items():
        cut_jsonl(source / name, target / name, list(range(rows)))
    shutil.copyfile(source / "LICENSE", target / "LICENSE")


def main(source_dir: str) -> None:
    source = Path(source_dir)
    cut_trajectories(source / "trajectories", HERE / "trajectories")
    cut_gsm8k(source / "gsm8k", HERE / "gsm8k")


if __name__ == "__main__":
    main(sys.argv[1])
