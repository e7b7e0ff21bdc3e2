"""The operator defaults of each training backend: the one home of these numbers.

The control plane's settings start from them (rlctl/service/settings.py; the operator may override each one), and the
trainer falls back on them for keys a run YAML leaves out.

`tinker`: the reference's values for Qwen3-8B on the Tinker service. `local`: chosen so that an offline run on the
`echo` environment with the tiny model learns visibly and finishes in a few minutes on 2 CPU cores: a rank-8 LoRA
on attention, MLP and lm_head with a high learning rate, groups of 8 completions, 4 groups per batch.
"""

from __future__ import annotations

from typing import TypedDict


class BackendDefaults(TypedDict):
    base_model: str | None  # None: the tiny random model in the data directory, created on first use
    learning_rate: float
    total_steps: int
    lora_rank: int
    batch_size: int
    group_size: int
    max_token_length: int
    max_token_trainer_length: int
    save_checkpoint_interval: int
    steps_per_eval: int
    loss_fn: str  # a LOSS_FUNCTIONS name (docs/TRAINER.md#grpo-step)


TINKER_BASE_MODEL = "Qwen/Qwen3-8B"
TINKER_DEFAULTS: BackendDefaults = {
    "base_model": TINKER_BASE_MODEL,
    "learning_rate": 4e-5,
    "total_steps": 2500,
    "lora_rank": 32,
    "batch_size": 128,
    "group_size": 16,
    "max_token_length": 8192,
    "max_token_trainer_length": 9000,
    "save_checkpoint_interval": 25,
    "steps_per_eval": 25,
    "loss_fn": "importance_sampling",
}

LOCAL_DEFAULTS: BackendDefaults = {
    "base_model": None,
    "learning_rate": 1e-2,
    "total_steps": 60,
    "lora_rank": 8,
    "batch_size": 32,
    "group_size": 8,
    "max_token_length": 512,
    "max_token_trainer_length": 1024,
    "save_checkpoint_interval": 20,
    # At most half of total_steps, so every run evaluates at least twice (docs/TRAINER.md#training-options).
    "steps_per_eval": 20,
    # The high learning rate that makes the tiny model learn in minutes also overshoots: without a clipped
    # ratio about one run in 25 collapsed to a policy whose every reply scored 0 (docs/TRAINER.md#grpo-step).
    "loss_fn": "ppo",
}

# The losses, by Tinker's names, and the PPO ratio bounds (Tinker's defaults). `gspo` (a sequence-level clipped
# ratio, Qwen's GSPO) is computed by the local backend only: Tinker has no such loss (docs/TRAINER.md#training-options).
# `cross_entropy` (-advantage x logprob, no ratio) is the supervised loss of an `sft` dataset run, local only too.
LOSS_FUNCTIONS = ("importance_sampling", "ppo", "gspo", "cross_entropy")
TINKER_LOSS_FUNCTIONS = ("importance_sampling", "ppo")
# tinker.sampler, the local backend's: `thread` (in the trainer process) or `process` (a child of its own, CPU
# only), docs/TRAINER.md#local-sampling
SAMPLERS = ("thread", "process")
PPO_CLIP_LOW = 0.8
PPO_CLIP_HIGH = 1.2
# How a group's rewards become advantages: reward - group mean (the seed's GRPO), that divided by the group's
# standard deviation, or the raw reward (no baseline).
ADVANTAGE_NORMALIZATIONS = ("group_mean", "mean_std", "none")
DEFAULT_ADVANTAGE_NORMALIZATION = "group_mean"
# The KL penalty to the reference model (the base with the adapter off): none by default, as in the seed.
DEFAULT_KL_COEF = 0.0
# LoRA's alpha is twice its rank unless a run says otherwise (the seed's choice; Tinker fixes its own).
LORA_ALPHA_PER_RANK = 2

# Tinker's Adam settings (docs/TRAINER.md#grpo-step); the local backend uses the same.
ADAM_BETA1 = 0.9
ADAM_BETA2 = 0.95
ADAM_EPS = 1e-8

# Failure budgets (docs/TRAINER.md#failure-budgets): consecutive failures, with no success between them, that end
# the run. Sampling calls come by the hundred per step, so one bad request never counts for much; a training
# step is one call chain, so a few in a row already say the backend is broken.
SAMPLING_ERROR_BUDGET = 100
TRAINING_ERROR_BUDGET = 3
