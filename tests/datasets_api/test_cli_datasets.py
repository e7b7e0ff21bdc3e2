"""The `rlctl datasets` client commands, as real subprocesses against the real dataset routes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from rlctl.service.settings import Settings
from tests.ops.cli import rlctl
from tests.support.live import live_service

TOKEN = "cli-datasets-token"


@pytest.mark.e2e
def test_upload_list_compress_score_and_export(
    make_settings: Callable[..., Settings], trajectories: Path, tmp_path: Path
) -> None:
    source = trajectories / "nemo-gym-mini-swe-agent-2-rollouts.jsonl"
    with live_service(make_settings(api_token=TOKEN)) as live, live.client() as api:
        uploaded = rlctl(live.base_url, "datasets", "upload", str(source), "--name", "cli", "--json", token=TOKEN)
        assert uploaded.returncode == 0, uploaded.stderr
        dataset = json.loads(uploaded.stdout)
        assert dataset["record_count"] == 2 and dataset["name"] == "cli"

        listed = rlctl(live.base_url, "datasets", "list", token=TOKEN)
        assert listed.returncode == 0 and dataset["id"] in listed.stdout

        compress = ("--set", "target_max_tokens=4000", "--set", "summary_target_tokens=200", "--json")
        compressed = rlctl(live.base_url, "datasets", "compress", dataset["id"], *compress, token=TOKEN)
        assert compressed.returncode == 0, compressed.stderr
        job = json.loads(compressed.stdout)
        assert job["status"] == "succeeded" and job["result"]["report"]["compressed"] == 2

        rewards = 'rewards=[{"name": "format"}, {"name": "correctness"}]'
        scored = rlctl(
            live.base_url, "datasets", "score", job["result"]["dataset_id"], "--set", rewards, "--json", token=TOKEN
        )
        assert scored.returncode == 0, scored.stderr
        scored_id = json.loads(scored.stdout)["result"]["dataset_id"]

        target = tmp_path / "scored.jsonl"
        exported = rlctl(live.base_url, "datasets", "export", scored_id, "-o", str(target), token=TOKEN)
        assert exported.returncode == 0, exported.stderr
        assert target.read_bytes() == api.get(f"/datasets/{scored_id}/export").content
        assert all("reward" in json.loads(line) for line in target.read_text().splitlines())

        broken = tmp_path / "broken.jsonl"
        broken.write_text('{"messages": [{"role": "robot", "content": "x"}]}\n', encoding="utf-8")
        refused = rlctl(live.base_url, "datasets", "upload", str(broken), "--name", "bad", token=TOKEN)
        assert refused.returncode == 1 and "INVALID_RECORDS" in refused.stderr and "Traceback" not in refused.stderr
        assert api.get("/datasets").json()["count"] == 3


def test_score_takes_rewards_a_grpo_file_name_gets_the_grpo_export_and_errors_name_their_field(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    replies = ["4", "It is 4.", "5", "I think 22."]  # one prompt, four replies: one GRPO group
    source = tmp_path / "replies.jsonl"
    source.write_text(
        "".join(
            json.dumps(
                {"conversations": [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": r}], "answer": "4"}
            )
            + "\n"
            for r in replies
        ),
        encoding="utf-8",
    )
    with live_service(make_settings(api_token=TOKEN)) as live:
        uploaded = rlctl(live.base_url, "datasets", "upload", str(source), "--name", "replies", "--json", token=TOKEN)
        dataset_id = json.loads(uploaded.stdout)["id"]

        scored = rlctl(
            live.base_url, "datasets", "score", dataset_id, "--reward", "correctness", "--reward", "format=0.5",
            "--json", token=TOKEN,
        )  # fmt: skip
        assert scored.returncode == 0, scored.stderr
        scored_id = json.loads(scored.stdout)["result"]["dataset_id"]

        target = tmp_path / "replies.grpo.jsonl"
        exported = rlctl(live.base_url, "datasets", "export", scored_id, "-o", str(target), token=TOKEN)
        assert exported.returncode == 0, exported.stderr
        (group,) = [json.loads(line) for line in target.read_text().splitlines()]
        assert len(group["advantages"]) == 4 and sorted(group["rewards"]) == [0.0, 0.0, 2.0, 2.0]

        plain = rlctl(live.base_url, "datasets", "export", scored_id, "--format", "sharegpt", token=TOKEN)
        assert plain.returncode == 0 and len(plain.stdout.splitlines()) == 4 and "advantages" not in plain.stdout

        refused = rlctl(
            live.base_url, "datasets", "score", dataset_id, "--reward", "correctness", "--set", "answer_field=no way",
            token=TOKEN,
        )  # fmt: skip
    assert refused.returncode == 1 and "VALIDATION_ERROR" in refused.stderr
    assert "answer_field: String should match pattern" in refused.stderr, refused.stderr  # the field and the reason
