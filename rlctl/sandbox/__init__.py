"""OS isolation of the commands a collection's agent runs: bubblewrap namespaces (`bubblewrap.py`), a seccomp
filter (`seccomp.py`), per-call memory cgroups (`memcap.py`), a network gate to named destinations only
(`netgate.py`), one command run to its end with time and output limits (`commands.py`) and file access confined
to a work directory (`workdir.py`), each item's a tmpfs of its own capped in bytes and files (`itemdisk.py`).

Knows nothing of collections, HTTP or the database: it imports nothing first-party, and raises its own errors
(`errors.py`), which the caller maps to its own.
"""
