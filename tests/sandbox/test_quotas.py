"""Quotas over whole items and collections (rlctl/sandbox/quotas.py): the host-wide item gate, a collection's
memory budget across its items, and its CPU quota, each tried with real threads, cgroups and sandboxed calls."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlctl.sandbox.bubblewrap import Sandbox
from rlctl.sandbox.quotas import CollectionQuota, ItemSlots, item_slots, memory_budget, throttled_periods
from tests.support.sandbox import required_sandbox
from tests.support.waiting import wait_until

HOLD = "import sys; b = bytearray({size}); b[::4096] = b'x' * len(b[::4096]); print('held', flush=True)"


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return required_sandbox()


@pytest.fixture
def quota(sandbox: Sandbox) -> Iterator[CollectionQuota]:
    made = CollectionQuota(sandbox.cgroup, budget_bytes=160 << 20, item_bytes=1 << 30, cpus=0.1)
    if made.missing:
        made.close()
        pytest.skip(f"quotas cannot be made here: {made.missing}")
    yield made
    made.close()


def run(sandbox: Sandbox, root: Path, quota: CollectionQuota, command: str) -> tuple[str, int]:
    root.mkdir()
    with sandbox.item(root, quota.item()) as item, item.start(command) as call:
        assert call.process.stdout is not None
        output = call.process.stdout.read().decode()
        return output, call.process.wait()


def test_items_wait_for_a_slot_and_give_up_when_stopped() -> None:
    slots = ItemSlots(2)
    assert slots.acquire() and slots.acquire()
    third_in = threading.Event()
    thread = threading.Thread(target=lambda: slots.acquire() and third_in.set())
    thread.start()
    try:
        assert not third_in.wait(0.3) and slots.running == 2  # a third waits while two run
        slots.release()
        wait_until(third_in.is_set, timeout=10, message="a released slot lets the waiting item in")
    finally:
        thread.join(timeout=10)
    assert slots.peak == 2 and slots.running == 2
    assert slots.acquire(should_stop=lambda: True) is False  # a cancelled collection stops waiting
    assert item_slots(3) is item_slots(3) and item_slots(3) is not item_slots(4)  # one gate per service
    assert memory_budget(1 << 30) == 1 << 30 and memory_budget(0) > 0  # 0: half of the host's memory


def test_a_collections_budget_holds_across_its_items(sandbox: Sandbox, quota: CollectionQuota, tmp_path: Path) -> None:
    """Each call may use 1 GiB; the collection's 160 MiB budget is shared by its items: an item whose work
    directory holds 100 MiB leaves the next less than 100 MiB, though each is far under its own limit."""
    alone, code = run(sandbox, tmp_path / "alone", quota, f'python3 -c "{HOLD.format(size=100 << 20)}"')
    assert (alone, code) == ("held\n", 0)
    first = tmp_path / "first"
    first.mkdir()
    with sandbox.item(first, quota.item()) as holder:
        with holder.start(
            "head -c 52428800 /dev/zero > a.bin && head -c 52428800 /dev/zero > b.bin && echo kept"
        ) as call:
            assert call.process.stdout is not None and call.process.stdout.read() == b"kept\n"
            assert call.process.wait() == 0
        assert holder.workdir.usage() >= 100 << 20  # held by the item's tmpfs, charged to the collection
        squeezed, code = run(sandbox, tmp_path / "second", quota, f'python3 -c "{HOLD.format(size=100 << 20)}"')
        assert "held" not in squeezed and code != 0, (squeezed, code)  # killed at the collection's budget
    again, code = run(sandbox, tmp_path / "third", quota, f'python3 -c "{HOLD.format(size=100 << 20)}"')
    assert (again, code) == ("held\n", 0)  # the first item ended: its memory went with it


def test_a_collections_calls_share_its_cpu_quota(sandbox: Sandbox, quota: CollectionQuota, tmp_path: Path) -> None:
    assert quota.cpu is not None and throttled_periods(quota.cpu) == 0
    output, code = run(sandbox, tmp_path / "busy", quota, "timeout 1 sh -c 'while :; do :; done'; echo done")
    assert output == "done\n", (output, code)
    assert throttled_periods(quota.cpu) > 0  # held to 0.1 of a core: the kernel throttled it
