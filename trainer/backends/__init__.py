"""Training backends behind one interface (`TrainingBackend`): `local` (torch + peft) and `tinker`."""

from __future__ import annotations

from trainer.backends.base import Checkpoint, TrainingBackend
from trainer.config import TrainerConfig


def make_backend(config: TrainerConfig, resume_from: Checkpoint | None = None) -> TrainingBackend:
    if config.backend == "local":
        from trainer.backends.local import LocalBackend

        return LocalBackend(config, resume_from)
    from trainer.backends.tinker_backend import TinkerBackend

    return TinkerBackend(config, resume_from)
