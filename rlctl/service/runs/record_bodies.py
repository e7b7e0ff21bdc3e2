"""GET /runs/{id}'s bodies, kept by what each is made of.

A run's record is a function of its inputs alone: its row (the JSON columns read as their text, so that a row is a
plain tuple), its place in the queue, the versions of the files it shows (the trainer's state, a dataset run's
split), the data directory and the roots its paths are shown relative to. The route reads those inputs on every
request (one statement and a stat or two) and sends the body made from the same inputs before, so a body is
never older than what the request read; a new step, heartbeat or process changes the row, a new state the file's
version, and the body is made again.

Part of the second read path of runs' two hottest reads: building the record (decoding its JSON columns, the
models, showing the paths of its config, writing its JSON) was half of a training run's record's CPU, 0.16 of
0.33 ms (benchmarks/read_cpu.py --training). Deleted when the ordinary path meets the reads' goals, as
rlctl/service/db/plans.py says.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

BODIES_KEPT = 256  # about 4 KB each, and the inputs they were made of


class RecordBodies:
    """The last `kept` bodies, by their inputs (the least recently sent go first). Safe across threads: a read plan
    runs on the event loop, or in a worker thread where PostgreSQL has no loop connections."""

    def __init__(self, kept: int = BODIES_KEPT) -> None:
        self._kept = kept
        self._bodies: OrderedDict[Hashable, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def body(self, inputs: Hashable, make: Callable[[], bytes]) -> bytes:
        """The body made of `inputs`: kept, or made now by `make` (outside the lock) and kept."""
        with self._lock:
            body = self._bodies.get(inputs)
            if body is not None:
                self._bodies.move_to_end(inputs)
                return body
        body = make()
        with self._lock:
            self._bodies[inputs] = body
            while len(self._bodies) > self._kept:
                self._bodies.popitem(last=False)
        return body
