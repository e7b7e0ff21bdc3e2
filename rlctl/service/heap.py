"""The service process's garbage collector, set once the app is built (`rlctl serve`).

CPython collects its youngest generation after every 700 new container objects and, as they age, the older ones
up to the whole heap. Under many connections a request that waits for its read (PostgreSQL's are awaited) holds
its objects past young collections, so they age, and the collections that follow walk the old generations: the
app's modules, models and schemas, built once and never garbage. `benchmarks/runs.py --reads-only --training
--postgres ...` (200 connections of GET /runs/{id} with a run training; req/s as a share of /healthz's): 0.30 with
the defaults, 0.52 with the heap frozen, 0.71 with the heap frozen and young collections every 50,000 objects
(GET /runs?limit=20: 0.29, 0.42, 0.58). Young garbage between two collections stays a few megabytes.
"""

from __future__ import annotations

import gc

YOUNG_COLLECTION_OBJECTS = 50_000


def settle() -> None:
    """Everything alive now is the app itself: moved out of the collector's walks for good (`gc.freeze`), and the
    youngest generation collected less often."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_OBJECTS, middle, oldest)
