"""What a run asks for (docs/RUNS.md#resources): the caller's values, else its backend's defaults, written here
once for POST /runs, rl_start_training and `rlctl runs start` alike."""

from __future__ import annotations

from rlctl.service.settings import Backend
from rlctl.supervisor.executor import Resources

# Per backend: a `local` run trains on this host (one GPU when the executor has any); a `tinker` run trains
# remotely, so only its three light processes (API, sampling client, environment) are here.
LOCAL_CPUS, LOCAL_MEMORY_GB = 1.0, 1.0
TINKER_CPUS, TINKER_MEMORY_GB = 1.0, 1.0


def default_resources(backend: Backend, has_gpus: bool) -> Resources:
    if backend == Backend.LOCAL:
        return Resources(cpus=LOCAL_CPUS, gpus=1 if has_gpus else 0, memory_gb=LOCAL_MEMORY_GB)
    return Resources(cpus=TINKER_CPUS, gpus=0, memory_gb=TINKER_MEMORY_GB)


def resolve_resources(
    backend: Backend, has_gpus: bool, cpus: float | None, gpus: int | None, memory_gb: float | None
) -> Resources:
    """Each value the caller gave, else the backend's default for it."""
    default = default_resources(backend, has_gpus)
    return Resources(
        cpus=default.cpus if cpus is None else cpus,
        gpus=default.gpus if gpus is None else gpus,
        memory_gb=default.memory_gb if memory_gb is None else memory_gb,
    )
