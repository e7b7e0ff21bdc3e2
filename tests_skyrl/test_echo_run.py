"""A whole `echo` run through rlctl's REST service, trained on SkyRL, to `completed`.

Everything real: the service (in this process, on loopback), its supervisor starting `run-api`, the trainer on the
`tinker` backend (TINKER_BASE_URL pointing at SkyRL) and `environments/echo.py`. The run's base model is the
tiny model's directory, the exact name SkyRL serves it under.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from rlctl.service.settings import Settings
from tests.support.live import live_service
from tests.support.waiting import wait_until
from tests_skyrl.server import API_KEY, SkyRLServer

TOTAL_STEPS = 3
TERMINAL = {"completed", "failed", "stopped"}


def settled(client: httpx.Client, run_id: str) -> dict | None:
    run = client.get(f"/runs/{run_id}").json()
    return run if run["status"] in TERMINAL else None


def test_an_echo_run_through_the_service_completes_on_skyrl(skyrl: SkyRLServer, tmp_path: Path) -> None:
    settings = Settings(
        _env_file=None,
        data_dir=tmp_path / "var",
        database_url=f"sqlite:///{tmp_path / 'rlctl.db'}",
        tinker_api_key=API_KEY,
        tinker_base_url=skyrl.url,
        tokenizer_name=str(skyrl.model_dir),
        max_token_length=512,
        max_token_trainer_length=1024,
        total_steps=TOTAL_STEPS,
        save_checkpoint_interval=2,
        steps_per_eval=1000,
        lora_rank=8,
        learning_rate=1e-2,
        stop_grace_s=5.0,
    )
    with live_service(settings) as live, live.client() as client:
        body = {"environment": "echo", "backend": "tinker", "config": {"group_size": 4, "batch_size": 8}}
        created = client.post("/runs", json=body)
        assert created.status_code == 201, created.text
        run_id = created.json()["id"]
        run = wait_until(lambda: settled(client, run_id), timeout=1200, interval=1.0, message="the run to end")
        trainer_log = client.get(f"/runs/{run_id}/logs/trainer", params={"tail": 60}).text
        assert run["status"] == "completed", f"{run.get('failure')}\n{trainer_log}"
        results = client.get(f"/runs/{run_id}/results").json()
        series = client.get(f"/runs/{run_id}/metrics").json()["metrics"]
        status = client.get(f"/runs/{run_id}/status").json()  # the first live check of the run is allowed

    assert run["last_step"] == TOTAL_STEPS and status["trainer"]["status"] == "completed"
    # What SkyRL ignores is on the run, in its record and its live status.
    ignored = {warning["parameter"] for warning in run["warnings"]}
    assert {"lora_config.train_unembed", "adam_params.grad_clip_norm"} <= ignored
    assert status["trainer"]["warnings"] == run["warnings"]
    assert results["weights"].startswith("tinker://")
    assert [c["step"] for c in results["checkpoints"]] == [2, TOTAL_STEPS]
    assert all(c["path"].startswith("tinker://") for c in results["checkpoints"])
    assert [step for step, _value in series["reward/mean"]] == list(range(1, TOTAL_STEPS + 1))
    assert {"train/loss", "logprobs/diff", "train/percent_correct"} <= set(series)  # trainer's and environment's
