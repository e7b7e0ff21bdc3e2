"""A small client of the Atropos trajectory API (`run-api`): register the trainer, pull batches."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx


class NotRegistered(RuntimeError):
    """The API has no trainer registration (for example it restarted, or /reset_data was called)."""


@dataclass(frozen=True)
class Registration:
    wandb_group: str
    wandb_project: str
    batch_size: int
    max_token_len: int
    checkpoint_dir: str
    save_checkpoint_interval: int
    starting_step: int
    num_steps: int


class AtroposClient:
    def __init__(self, base_url: str, timeout_s: float = 30.0) -> None:
        # A plain-HTTP address has no certificate to check (loading the CA bundle took 25 ms of each start).
        plain = base_url.startswith("http://")
        self._http = httpx.Client(base_url=base_url, timeout=timeout_s, verify=not plain)
        self.base_url = base_url

    def wait_until_up(self, timeout_s: float, pause: Callable[[float], bool], poll_s: float = 0.2) -> bool:
        """True once the API answers; False when `pause` (a wait that returns True on stop) says to stop."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._http.get("/status").raise_for_status()
                return True
            except httpx.HTTPError as error:
                if time.monotonic() > deadline:
                    message = f"the Atropos API at {self.base_url} did not answer: {error}"
                    raise RuntimeError(message) from error
            if pause(poll_s):
                return False

    def register(self, registration: Registration) -> int:
        response = self._http.post("/register", json=registration.__dict__)
        response.raise_for_status()
        return int(response.json()["uuid"])

    def get_batch(self) -> list[dict[str, Any]] | None:
        """The next batch of groups, or None when none is ready yet."""
        response = self._http.get("/batch")
        response.raise_for_status()
        payload = response.json()
        if payload.get("status") == "error":
            raise NotRegistered(payload.get("message", "trainer not registered"))
        return payload.get("batch") or None

    def status(self) -> dict[str, Any]:
        response = self._http.get("/status")
        response.raise_for_status()
        return response.json()

    def close(self) -> None:
        self._http.close()
