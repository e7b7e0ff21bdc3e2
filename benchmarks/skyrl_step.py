"""Trainer step time against SkyRL's Tinker-compatible server on the CPU, next to the local backend, in one run.

    make install-skyrl && .venv/bin/python benchmarks/skyrl_step.py [--steps 10] [--warmup 2]

One tiny model (rlctl's, 2 layers, 64 wide) for both: SkyRL serves its directory from .venv-skyrl (JAX backend,
CPU), and the local backend (torch + peft) loads the same directory. Each backend runs the same GRPO steps
(trainer_step.run_steps): rollouts sampled from its newest weights, posted to a real `run-api`, then the trainer's
phases timed one by one. Printed: ms per phase for each backend and the SkyRL / local ratio, and steps per second.
SkyRL's LoRA has no lm_head adapter (it ignores train_unembed), the local one has.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.trainer_step import PHASES, StepFigures, add_step_arguments, run_steps  # noqa: E402
from rlctl.supervisor.ports import free_ports  # noqa: E402
from rlctl.trainer.backends.local import LocalBackend  # noqa: E402
from rlctl.trainer.backends.tinker_backend import TinkerBackend  # noqa: E402
from rlctl.trainer.config import TrainerConfig, parse_config  # noqa: E402
from tests_skyrl.server import API_KEY, skyrl_server  # noqa: E402


def backend_config(backend: str, model_dir: Path, workdir: Path, args: argparse.Namespace) -> TrainerConfig:
    section = {"backend": backend, "base_model": str(model_dir), "lora_rank": 8, "learning_rate": args.learning_rate}
    section.update(run_dir=str(workdir / backend), inference_port=1, device="cpu", seed=0)
    return parse_config({"env": {"rollout_server_url": "http://127.0.0.1:1"}, "tinker": section})


def report(local: StepFigures, skyrl: StepFigures) -> None:
    rows = [(phase.removesuffix("_s"), local.mean_s(phase), skyrl.mean_s(phase)) for phase in PHASES]
    rows.append(("step total (trainer)", local.step_s, skyrl.step_s))
    local_sampling, skyrl_sampling = statistics.mean(local.rollout_s), statistics.mean(skyrl.rollout_s)
    rows.append(("sampling (rollouts)", local_sampling, skyrl_sampling))
    print(f"  {'phase':<22} {'local ms':>10} {'SkyRL ms':>10} {'SkyRL/local':>12}")
    for name, local_s, skyrl_s in rows:
        ratio = f"{skyrl_s / local_s:11.1f}x" if local_s >= 1e-4 else f"{'-':>12}"  # local publish is in-process
        print(f"  {name:<22} {local_s * 1000:10.1f} {skyrl_s * 1000:10.1f} {ratio}")
    for label, figures, sampling in (("local", local, local_sampling), ("SkyRL", skyrl, skyrl_sampling)):
        print(
            f"steps/s {label:<6}: trainer step {1 / figures.step_s:.2f}, "
            f"with rollout sampling {1 / (figures.step_s + sampling):.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_step_arguments(parser, steps=10, warmup=2)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="rlctl-bench-skyrl-"))
    with skyrl_server(workdir / "skyrl", free_ports(1)[0]) as server:
        local = run_steps(LocalBackend(backend_config("local", server.model_dir, workdir, args)), args, workdir)
        os.environ.update(TINKER_BASE_URL=server.url, TINKER_API_KEY=API_KEY, HF_HUB_OFFLINE="1")
        remote = TinkerBackend(backend_config("tinker", server.model_dir, workdir, args))
        try:
            skyrl = run_steps(remote, args, workdir)
        finally:
            remote.close()

    print(
        f"trainer step, SkyRL 0.4 (JAX, CPU, tinker protocol {remote.protocol}) vs local backend (torch "
        f"{torch.__version__}, {torch.get_num_threads()} threads), tiny Qwen3, LoRA rank 8, {args.groups} groups x "
        f"{args.group_size} rollouts x {args.new_tokens} new tokens, {args.steps} steps after {args.warmup} warm-up"
    )
    report(local, skyrl)


if __name__ == "__main__":
    main()
