"""Steps per second of the offline echo pipeline against TRL's GRPOTrainer on the same task, side by side.

    .venv/bin/pip install -e '.[bench]'      # TRL, pinned; not part of `make test`
    .venv/bin/python benchmarks/peer_trl.py [--steps 60] [--repeats 1] [--only rlctl|trl] [--samplers]
        [--trl-threads 1,2] [--against REV]

Both train the project's tiny model (built locally, nothing downloaded) on the echo task: groups of 8
completions of at most 8 tokens, 4 groups (32 completions) per step, learning rate 1e-2, Adam β2 0.95, the echo
reward of `environments/echo.py` (`score_reply`, default window and weight), the PPO ratio clipped to 0.8/1.2, no
KL term, advantages not divided by the group's standard deviation.

- **rlctl**: the real offline pipeline (`run-api`, the trainer on the local backend, `environments/echo.py`),
  as `tests/trainer/pipeline.run_pipeline` starts it: three processes talking HTTP. The environment's worker cap is
  the one the service writes into every run (`max_num_workers`, docs/RUNS.md#locked-fields): with atroposlib's own
  default (8 per inference server) an environment starts at most 8 groups per turn of its 0.1 s loop, which held
  this pipeline at 20 steps/s (issue 40).
- **TRL**: `GRPOTrainer` in one process, on the CPU. TRL refuses a LoRA adapter on `lm_head` (it computes
  logprobs from `lm_head.weight` directly), so its LoRA (rank 8, alpha 16) covers attention and MLP and the
  whole `lm_head` trains (`modules_to_save`); rlctl's LoRA covers `lm_head` too.

Thread budget: rlctl's trainer gives training and sampling half the cores each (one thread each on 2 cores).
TRL runs in one process; it is measured with each torch thread count of `--trl-threads` (default 1 and the
number rlctl uses in all, i.e. the cores, up to 2), so that it has the same budget both ways: on a shared machine
one thread often beats two (issue 40: 8.7-10.2 steps/s at 1 against 0.9-2.4 at 2 beside neighbours).
With `--samplers`, rlctl runs twice per repeat, with `tinker.sampler: thread` (sampling on a thread of the trainer
process, the trainer before issue 40) and `process` (its own process), and their ratio is printed.
With `--against REV` (e.g. `badaac7`, the code when issue 40 was filed), each repeat also runs the pipeline as
that revision builds it (its own benchmark, in a git worktree, every process importing its rlctl), and each
sampler's ratio to it is printed: a goal's "x today's" measured on the same machine in the same run, not
against a figure of another day (this machine measured 16-17 steps/s at the filing and 15 on a later day).

Printed per system and repeat: steps per second over the training steps (from the end of the first step to the
end of the last, so start-up is left out), the wall time end to end, and the mean reward of the first and last
quarter of steps; then the ratio rlctl / TRL of steps per second (the goal: at least 1).
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The repository root, not benchmarks/ (whose datasets.py would hide the `datasets` package TRL needs).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlctl.service.settings import Settings  # noqa: E402
from rlctl.trainer.tiny_model import init_tiny_model  # noqa: E402
from tests.trainer.pipeline import child_environment, run_pipeline, step_metrics  # noqa: E402

GROUP_SIZE = 8
GROUPS_PER_STEP = 4
REPLY_TOKENS = 8
LEARNING_RATE = 1e-2
SERVICE_WORKER_CAP = Settings.model_fields["max_num_workers"].default
LORA_RANK = 8


@dataclass(frozen=True)
class Outcome:
    system: str
    steps: int
    train_s: float  # from the end of the first step to the end of the last
    wall_s: float  # end to end, start-up included
    rewards: list[float]

    @property
    def steps_per_s(self) -> float:
        return (self.steps - 1) / self.train_s

    def quarters(self) -> tuple[float, float]:
        quarter = max(1, len(self.rewards) // 4)
        return statistics.fmean(self.rewards[:quarter]), statistics.fmean(self.rewards[-quarter:])

    def line(self) -> str:
        first, last = self.quarters()
        return (
            f"{self.system:>15}: {self.steps_per_s:5.2f} steps/s ({self.train_s / (self.steps - 1) * 1000:6.1f} ms per "
            f"step), {self.wall_s:6.1f} s end to end, reward first quarter {first:.3f}, last quarter {last:.3f}"
        )


def run_rlctl(workdir: Path, model_dir: Path, steps: int, seed: int, sampler: str = "thread") -> Outcome:
    run_dir = workdir / f"rlctl-seed{seed}-{sampler}"
    started = time.monotonic()
    run = run_pipeline(
        run_dir,
        model_dir=model_dir,
        total_steps=steps,
        environment=child_environment(workdir / "var", WANDB_MODE="disabled"),
        timeout_s=1800,
        start_timeout_s=300,
        env={"seed": seed, "steps_per_eval": 10 * steps, "max_num_workers": SERVICE_WORKER_CAP},
        tinker={
            "seed": seed,
            "learning_rate": LEARNING_RATE,
            "save_checkpoint_interval": 10 * steps,
            "sampler": sampler,
        },
    )
    wall_s = time.monotonic() - started
    if run.exit_code != 0:
        raise SystemExit(f"rlctl: the trainer failed:\n{run.trainer.log_tail()}")
    records = step_metrics(run_dir)
    times = [record["time"] for record in records]
    rewards = [r["metrics"]["reward/mean"] for r in records]
    name = f"rlctl ({sampler})"
    waits = statistics.fmean(r["metrics"]["time/wait_for_batch_s"] for r in records[1:])
    steps = statistics.fmean(r["metrics"]["time/step_s"] for r in records[1:])
    print(f"{name:>15}: per step, waiting for the batch {waits * 1000:6.1f} ms, the step itself {steps * 1000:6.1f} ms")
    return Outcome(name, len(records), times[-1] - times[0], wall_s, rewards)


def run_trl(workdir: Path, model_dir: Path, steps: int, seed: int, threads: int) -> Outcome:
    import torch

    torch.set_num_threads(threads)  # the thread budget under test (module docstring)
    started = time.monotonic()
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlctl.trainer.backends.local import linear_module_names

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "environments"))
    from echo import EchoConfig, score_reply

    defaults = EchoConfig.model_fields
    window, weight = defaults["reply_tokens"].default, defaults["digit_weight"].default
    rng = random.Random(seed)
    targets = ["".join(rng.choice("0123456789") for _ in range(4)) for _ in range(steps * GROUPS_PER_STEP)]
    dataset = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"Echo: {target}"}], "target": target} for target in targets]
    )

    def echo_reward(completions: list[Any], target: list[str], **_: Any) -> list[float]:
        texts = [c[0]["content"] if isinstance(c, list) else str(c) for c in completions]
        return [score_reply(text, wanted, window, weight) for text, wanted in zip(texts, target, strict=True)]

    step_ends: list[float] = []

    class StepClock(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *_args: Any, **_kwargs: Any) -> None:
            step_ends.append(time.monotonic())

    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    lora = LoraConfig(
        r=LORA_RANK,
        lora_alpha=2 * LORA_RANK,
        target_modules=[name for name in linear_module_names(model) if name != "lm_head"],
        modules_to_save=["lm_head"],
        lora_dropout=0.0,
        bias="none",
    )
    config = GRPOConfig(
        output_dir=str(workdir / "trl"),
        per_device_train_batch_size=GROUP_SIZE * GROUPS_PER_STEP,
        gradient_accumulation_steps=1,
        num_generations=GROUP_SIZE,
        max_completion_length=REPLY_TOKENS,
        temperature=1.0,
        learning_rate=LEARNING_RATE,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=0.9,
        adam_beta2=0.95,
        adam_epsilon=1e-8,
        weight_decay=0.0,
        max_grad_norm=0.0,
        beta=0.0,
        epsilon=0.2,
        scale_rewards="none",
        max_steps=steps,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed=seed,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=echo_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora,
        callbacks=[StepClock()],
    )
    trainer.train()
    wall_s = time.monotonic() - started
    rewards = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    return Outcome(f"TRL ({threads} thr)", len(step_ends), step_ends[-1] - step_ends[0], wall_s, rewards)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--only", choices=["rlctl", "trl"], default=None)
    parser.add_argument("--samplers", action="store_true", help="rlctl with each sampler: thread, then process")
    default_threads = f"1,{min(2, os.cpu_count() or 1)}" if (os.cpu_count() or 1) > 1 else "1"
    parser.add_argument("--trl-threads", default=default_threads, help="TRL's torch thread counts, comma-separated")
    parser.add_argument(
        "--against", metavar="REV", help="also rlctl at this git revision, each repeat (e.g. a goal's baseline)"
    )
    args = parser.parse_args()
    samplers = ["thread", "process"] if args.samplers else ["thread"]
    trl_threads = [int(value) for value in args.trl_threads.split(",")]
    if args.only != "rlctl" and importlib.util.find_spec("trl") is None:
        print("TRL is not installed (pip install -e '.[bench]'): measuring rlctl only", flush=True)
        args.only = "rlctl"
    print(f"load average at start: {os.getloadavg()}", flush=True)
    outcomes: dict[str, list[Outcome]] = {}
    with tempfile.TemporaryDirectory(prefix="rlctl-peer-trl-") as scratch, _checkout(args.against) as baseline:
        workdir = Path(scratch)
        model_dir = init_tiny_model(workdir / "var" / "models" / "tiny-qwen3", seed=0)
        for repeat in range(args.repeats):
            runs: list[Outcome] = []
            if baseline is not None:
                runs.append(run_revision(baseline, args.against, args.steps))
                print(runs[-1].line(), flush=True)
            if args.only != "trl":
                runs += [run_rlctl(workdir, model_dir, args.steps, repeat, sampler) for sampler in samplers]
                for outcome in runs[-len(samplers) :]:
                    print(outcome.line(), flush=True)
            if args.only != "rlctl":
                for threads in trl_threads:
                    # Each in a child process: its thread count and imports stay its own.
                    runs.append(
                        _in_child(run_trl, workdir / f"trl-{repeat}-{threads}", model_dir, args.steps, repeat, threads)
                    )
                    print(runs[-1].line(), flush=True)
            for outcome in runs:
                outcomes.setdefault(outcome.system, []).append(outcome)
            print(f"load average after repeat {repeat}: {os.getloadavg()}", flush=True)
    medians = {system: statistics.median(o.steps_per_s for o in runs) for system, runs in outcomes.items()}
    print("median steps/s: " + ", ".join(f"{system} {value:.2f}" for system, value in medians.items()))
    if "rlctl (thread)" in medians and "rlctl (process)" in medians:
        print(f"process sampler / thread sampler: {medians['rlctl (process)'] / medians['rlctl (thread)']:.2f}x")
    if args.against is not None:
        base = f"rlctl at {args.against}"
        for system in (f"rlctl ({sampler})" for sampler in samplers if args.only != "trl"):
            print(f"{system} / {base}: {medians[system] / medians[base]:.2f}x")
    ours = [value for system, value in medians.items() if system.startswith("rlctl (")]
    for system, value in medians.items():
        if system.startswith("TRL"):
            print(f"rlctl (best) / {system}: {max(ours) / value:.2f}" if ours else "")


@contextmanager
def _checkout(revision: str | None) -> Iterator[Path | None]:
    """A detached git worktree of `revision` (removed at the end), or None."""
    if revision is None:
        yield None
        return
    repository = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="rlctl-peer-trl-rev-") as scratch:
        path = Path(scratch) / "checkout"
        subprocess.run(["git", "-C", str(repository), "worktree", "add", "--detach", str(path), revision], check=True)
        try:
            yield path
        finally:
            subprocess.run(["git", "-C", str(repository), "worktree", "remove", "--force", str(path)], check=False)


def run_revision(checkout: Path, revision: str, steps: int) -> Outcome:
    """rlctl's pipeline as `checkout` (a revision's worktree) builds and measures it: its own peer_trl.py, run by
    this interpreter (the same packages), every process of it importing that checkout's rlctl. Its default
    sampler, and its own seed 0."""
    environment = {**os.environ, "PYTHONPATH": str(checkout)}
    command = [sys.executable, "benchmarks/peer_trl.py", "--only", "rlctl", "--repeats", "1", "--steps", str(steps)]
    started = time.monotonic()
    output = subprocess.run(
        command, cwd=checkout, env=environment, capture_output=True, text=True, timeout=1800, check=True
    ).stdout
    found = _RESULT_LINE.search(output)
    if found is None:
        raise SystemExit(f"rlctl at {revision} printed no result:\n{output}")
    per_s, first, last = (float(value) for value in found.groups())
    # Its line gives the rate and the quarters' mean rewards: a two-entry list's quarters are those two.
    return Outcome(f"rlctl at {revision}", steps, (steps - 1) / per_s, time.monotonic() - started, [first, last])


_RESULT_LINE = re.compile(r"rlctl[^:\n]*: +([\d.]+) steps/s .*reward first quarter ([\d.]+), last quarter ([\d.]+)")


def _in_child(function: Any, *args: Any) -> Outcome:
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        return pool.apply(function, args)  # type: ignore[no-any-return]


if __name__ == "__main__":
    main()
