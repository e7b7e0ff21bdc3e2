"""The service's collector settings (rlctl/service/heap.py), in a process of their own: they are the process's."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.waiting import REQUEST_TIMEOUT

SETTLE = """
import gc, json, weakref
import rlctl.service.app  # the modules of the app: what `rlctl serve` has imported when it settles
from rlctl.service import heap

heap.settle()
frozen, threshold = gc.get_freeze_count(), gc.get_threshold()

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a  # garbage made after settling, in a cycle: still collected
alive = weakref.ref(a)
del a, b
gc.collect()
print(json.dumps({"frozen": frozen, "threshold": threshold, "cycle_collected": alive() is None}))
"""


def test_settling_freezes_the_app_and_collects_the_young_less_often_but_still_collects() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SETTLE], capture_output=True, text=True, timeout=REQUEST_TIMEOUT, check=True
    )
    settled = json.loads(result.stdout)
    assert settled["frozen"] > 100_000  # the app's modules and their objects, out of every walk
    assert settled["threshold"][0] == 50_000
    assert settled["cycle_collected"] is True
