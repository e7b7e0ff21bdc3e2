"""One model's child (rlctl/service/inference_tests/child.py) on its own, forked as the service forks it: what it
records, and what of atroposlib's `process` mode it leaves out."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from rlctl.service.children import ChildRunner, process_fork_server
from rlctl.service.inference_tests.jobs import InferencePlan, child_environment, process_config
from rlctl.service.settings import Settings
from tests.conftest import REPO_ROOT, build_settings
from tests.inference_tests.conftest import SERVED_MODELS


def test_the_child_records_every_group_and_renders_no_html_page(
    tmp_path: Path, tiny_model: Path, endpoint: str
) -> None:
    settings: Settings = build_settings(
        tmp_path / "var", f"sqlite:///{tmp_path / 'unused.db'}", tokenizer_name=str(tiny_model)
    )
    plan = InferencePlan(
        job_id="child",
        environment="echo",
        env_file=REPO_ROOT / "environments" / "echo.py",
        class_name="EchoEnv",
        num_steps=2,
        group_size=4,
        models=[SERVED_MODELS[0]],
        base_url=endpoint,
        edits={},
        timeout_s=120,
        output_dir=tmp_path / "out",
    )
    groups = tmp_path / "groups" / "groups.jsonl"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(process_config(plan, settings, SERVED_MODELS[0], groups)))
    argv = [sys.executable, "-m", "rlctl.service.inference_tests.child", str(plan.env_file), plan.class_name]
    argv += [str(tmp_path / "config.yaml"), str(tmp_path / "records.jsonl")]
    done = ChildRunner(process_fork_server()).run(
        argv, env=child_environment(settings, None), cwd=tmp_path, timeout_s=240
    )
    assert done.returncode == 0, done.stdout.decode()[-2000:] + done.stderr.decode()[-2000:]

    records = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert [record.get("step") for record in records[:-1]] == [1, 2] and records[-1] == {"event": "finished"}
    assert all(len(record["scores"]) == 4 for record in records[:-1])
    assert len(groups.read_text().splitlines()) == 2, "atroposlib still writes its groups"
    assert not groups.with_suffix(".html").exists(), "no page of them: the work directory is deleted unread"
