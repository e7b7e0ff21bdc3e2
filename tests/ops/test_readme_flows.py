"""The README's curl blocks, run as written by bash against a live service: a flow the README shows works.

Every ```sh block that calls the service runs in one shell, in README order (later blocks use the variables
earlier ones set: $DS, $RUN), with `curl` failing on any HTTP error and the token added. What stands in for the
outside world: OpenRouter is a closed loopback port (its inference test is accepted, 202, then fails; nothing is
paid for), the tokenizer is the tiny model's, and the local backend trains the tiny model for a few steps.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from rlctl.service.settings import Settings
from tests.architecture.layers import REPO_ROOT
from tests.support.live import free_port, live_service
from tests.support.tiny_model import session_tiny_model
from tests.support.waiting import scaled

TOKEN = "readme-flows-token"
PRELUDE = """set -euo pipefail
curl() {  # an HTTP error fails the flow, its body on stderr
  local out
  if ! out=$(command curl --fail-with-body -sS -H "Authorization: Bearer $RLCTL_API_TOKEN" "$@"); then
    echo "$out" >&2
    return 22
  fi
  printf '%s\n' "$out"
}
"""


def readme_flows() -> list[str]:
    """The README's sh blocks that call the service."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    return [block for block in re.findall(r"```sh\n(.*?)```", readme, re.S) if "curl " in block]


def stop_every_run(client: httpx.Client) -> None:
    for run in client.get("/runs", params={"limit": 100}).json()["runs"]:
        if run["status"] not in ("completed", "failed", "stopped", "cancelled"):
            client.post(f"/runs/{run['id']}/stop", params={"wait_s": 30})


@pytest.mark.e2e
@pytest.mark.skipif(not (shutil.which("jq") and shutil.which("curl")), reason="the README's flows use curl and jq")
def test_the_readme_curl_flows_run_as_written(run_settings: Callable[..., Settings], tmp_path: Path) -> None:
    flows = readme_flows()
    assert len(flows) >= 4
    settings = run_settings(
        api_token=TOKEN,
        openrouter_api_key="sk-or-readme-flows",
        openrouter_base_url=f"http://127.0.0.1:{free_port()}/v1",
        tokenizer_name=str(session_tiny_model()),  # the inference test counts tokens with the tiny model's
    )
    with live_service(settings) as live, live.client() as client:
        host = live.base_url.removeprefix("http://")
        script = PRELUDE + "\n".join(
            f"echo '### README flow {number}' >&2\n{flow.replace('localhost:8080', host)}"
            for number, flow in enumerate(flows, 1)
        )
        try:
            done = subprocess.run(
                ["bash", "-c", script],
                cwd=tmp_path,
                env={"PATH": "/usr/bin:/bin", "RLCTL_API_TOKEN": TOKEN, "HOME": str(tmp_path)},
                capture_output=True,
                text=True,
                timeout=scaled(300),
            )
        finally:
            stop_every_run(client)
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stderr.count("### README flow") == len(flows)
        runs = client.get("/runs").json()["runs"]
    assert {run["environment"] for run in runs} >= {"echo", "dataset_offline"}
    assert any(run["status"] == "completed" and run["environment"] == "dataset_offline" for run in runs)
    assert (tmp_path / "mine.jsonl").stat().st_size > 0
