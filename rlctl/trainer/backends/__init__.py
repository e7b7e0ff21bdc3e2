"""Training backends behind one interface (`TrainingBackend`): `local` (torch + peft) and `tinker`."""

from __future__ import annotations

from rlctl.trainer.backends.base import Checkpoint, TrainingBackend
from rlctl.trainer.config import TrainerConfig


def make_backend(config: TrainerConfig, resume_from: Checkpoint | None = None) -> TrainingBackend:
    if config.backend == "local":
        from rlctl.trainer.backends.local import LocalBackend

        return LocalBackend(config, resume_from)
    from rlctl.trainer.backends.tinker_backend import TinkerBackend

    return TinkerBackend(config, resume_from)
