"""Locked defaults of the `local` backend, importable by the control plane for its run configuration.

Chosen so that an offline run on the `echo` environment with the tiny model learns visibly and finishes in a
few minutes on 2 CPU cores: a rank-8 LoRA on attention, MLP and lm_head with a high learning rate,
groups of 8 completions, 4 groups per batch.
"""

from __future__ import annotations

from typing import Any

LOCAL_DEFAULTS: dict[str, Any] = {
    "base_model": None,  # None: the tiny random model in the data directory, created on first use
    "learning_rate": 1e-2,
    "total_steps": 60,
    "lora_rank": 8,
    "batch_size": 32,
    "group_size": 8,
    "max_token_length": 512,
    "max_token_trainer_length": 1024,
    "save_checkpoint_interval": 20,
}

# Tinker's Adam settings (docs/TRAINER.md#grpo-step); the local backend uses the same.
ADAM_BETA1 = 0.9
ADAM_BETA2 = 0.95
ADAM_EPS = 1e-8
