"""Checkpoint retention (docs/TRAINER.md#retention): the newest keep_last_n, the best, the pinned and those in use
stay; the rest are deleted, by the trainer, in a real run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rlctl.trainer.retention import LEASES_DIR, in_use, leased, prune, to_delete, write_pinned
from tests.trainer.pipeline import child_environment, run_pipeline, trainer_state


def test_to_delete_keeps_the_newest_and_the_kept() -> None:
    assert to_delete([2, 4, 6, 8, 10], 2, {4}) == [2, 6]
    assert to_delete([2, 4], 5, set()) == []


def test_a_lease_holds_while_its_holder_lives(tmp_path: Path) -> None:
    step = tmp_path / "step_2"
    step.mkdir()
    with leased(step, "test"):
        assert in_use(step)
    assert not in_use(step)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (step / LEASES_DIR / f"{dead.stdout.strip()}-gone").touch()  # its process has exited: it holds nothing
    assert not in_use(step)


def test_prune_spares_the_best_pinned_and_leased_and_stays_in_the_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    entries = []
    for step in (2, 4, 6, 8, 10):
        directory = run_dir / "checkpoints" / f"step_{step}"
        directory.mkdir(parents=True)
        entries.append({"step": step, "path": str(directory)})
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    entries.append({"step": 1, "path": str(outside)})
    entries.append({"step": 0, "path": "tinker://x/weights/step_0"})
    write_pinned(run_dir, {4})
    with leased(run_dir / "checkpoints" / "step_6", "evaluation"):
        deleted = prune(run_dir, entries, 1, best_step=2)
    assert deleted == [8]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_10", "step_2", "step_4", "step_6"]
    assert outside.exists()


def test_a_run_keeps_only_what_retention_says(tiny_model_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "kept"
    run_dir.mkdir()
    (run_dir / "pinned_checkpoints.json").write_text(json.dumps({"steps": [4]}))
    run = run_pipeline(
        run_dir,
        model_dir=tiny_model_dir,
        total_steps=12,
        environment=child_environment(tmp_path / "var"),
        timeout_s=240,
        env={"seed": 0},
        tinker={"seed": 0, "save_checkpoint_interval": 2, "keep_last_n": 2},
    )
    assert run.exit_code == 0, run.trainer.log_tail()
    state = trainer_state(run_dir)
    best = state["best_checkpoint"]["step"]
    expected = sorted({4, 10, 12, best})
    assert [entry["step"] for entry in state["checkpoints"]] == expected
    on_disk = sorted(int(p.name.removeprefix("step_")) for p in (run_dir / "checkpoints").glob("step_*"))
    assert on_disk == expected and os.path.isdir(state["weights"])
