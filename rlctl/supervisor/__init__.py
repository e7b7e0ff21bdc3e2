"""Process supervision for training runs: spawn, readiness, watch, stop, reap, re-adopt.

Knows nothing of HTTP servers it is part of, nor of the database: callers pass plans in and receive events.
"""
