"""Collapses of offline echo runs, by policy loss: the same seeds trained with each loss, some at a time.

    .venv/bin/python benchmarks/collapse.py [--runs 50] [--parallel 10] [--steps 32] [--loss ppo importance_sampling]

Each run is the real pipeline (`run-api`, the trainer on the local backend with the tiny model, and
`environments/echo.py`), as in tests/trainer/test_echo_pipeline.py. A run has collapsed when the mean reward of
its last quarter of steps is under 0.01: every reply scores 0, no group differs, nothing trains again
(docs/TRAINER.md#grpo-step). Printed per loss: collapses, mean first- and last-quarter reward, seconds per run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlctl.trainer.tiny_model import init_tiny_model  # noqa: E402
from tests.trainer.pipeline import child_environment, run_pipeline, step_metrics  # noqa: E402

COLLAPSED_BELOW = 0.01


@dataclass(frozen=True)
class RunOutcome:
    loss: str
    seed: int
    first_quarter: float
    last_quarter: float
    seconds: float

    @property
    def collapsed(self) -> bool:
        return self.last_quarter < COLLAPSED_BELOW


def run_once(workdir: Path, model_dir: Path, loss: str, steps: int, seed: int) -> RunOutcome:
    run_dir = workdir / f"{loss}-seed{seed}"
    started = time.monotonic()
    run = run_pipeline(
        run_dir,
        model_dir=model_dir,
        total_steps=steps,
        environment=child_environment(workdir / "var"),
        timeout_s=3600,
        start_timeout_s=600,
        env={"seed": seed, "steps_per_eval": 10 * steps},
        tinker={"seed": seed, "loss_fn": loss},
    )
    if run.exit_code != 0:
        raise SystemExit(f"{run_dir.name}: the trainer failed:\n{run.trainer.log_tail()}")
    rewards = [record["metrics"]["reward/mean"] for record in step_metrics(run_dir)]
    quarter = max(1, len(rewards) // 4)
    outcome = RunOutcome(
        loss,
        seed,
        statistics.fmean(rewards[:quarter]),
        statistics.fmean(rewards[-quarter:]),
        time.monotonic() - started,
    )
    # One line per run as it ends, so a long benchmark shows its count so far.
    print(
        f"{loss} seed {seed}: reward first quarter {outcome.first_quarter:.3f}, last {outcome.last_quarter:.3f}"
        f"{' COLLAPSED' if outcome.collapsed else ''}",
        flush=True,
    )
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=50, help="runs per loss (seeds 0..runs-1)")
    parser.add_argument("--parallel", type=int, default=10)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--loss", nargs="+", default=["ppo", "importance_sampling"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlctl-collapse-") as scratch:
        workdir = Path(scratch)
        model_dir = init_tiny_model(workdir / "var" / "models" / "tiny-qwen3", seed=0)
        for loss in args.loss:
            with ThreadPoolExecutor(args.parallel) as pool:
                outcomes = list(pool.map(partial(run_once, workdir, model_dir, loss, args.steps), range(args.runs)))
            collapsed = [o.seed for o in outcomes if o.collapsed]
            print(
                f"{loss:>20}: {len(collapsed)}/{len(outcomes)} collapsed (seeds {collapsed}); "
                f"reward first quarter {statistics.fmean(o.first_quarter for o in outcomes):.3f}, "
                f"last quarter {statistics.fmean(o.last_quarter for o in outcomes):.3f}; "
                f"{statistics.fmean(o.seconds for o in outcomes):.0f} s per run, {args.parallel} at a time"
            )


if __name__ == "__main__":
    main()
