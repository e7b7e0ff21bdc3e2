"""An echo environment that never registers with its run's Atropos API, so its run stays `starting` until it is
stopped: what a test of a stop during start-up needs once a start takes well under a second (tests/runs)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import rlctl
from rlctl.service.environments.introspect import load_environment_class

# Found through the project's installed package, not beside this file: a run on Ray gets a copy of this file alone,
# in the node's data directory (docs/RAY.md).
_ECHO = Path(rlctl.__file__).resolve().parents[1] / "environments" / "echo.py"
EchoEnv = load_environment_class(_ECHO, "EchoEnv")  # a base by name: the catalog finds environments by their bases


class NeverRegistersEnv(EchoEnv):
    """Echo, waiting forever where it would register."""

    name = "never_registers"

    async def register_env(self) -> None:
        await asyncio.Event().wait()


if __name__ == "__main__":
    NeverRegistersEnv.cli()
