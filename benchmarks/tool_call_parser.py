"""What a Python-literal tool-call body costs to read: the former `ast.literal_eval` fallback against the linear
reader that replaced it (rlctl/trajectories/literals.py), both measured in this run.

    .venv/bin/python benchmarks/tool_call_parser.py [--mib 1] [--repeats 3]

Bodies of `--mib` MiB that are not JSON (so both readers take the fallback path): a flat list of single-quoted
strings with a trailing comma, and a dict of single-quoted strings. The reader's 64 KiB cap is lifted here to
compare equal inputs. Printed per body and reader: median seconds and peak traced memory (tracemalloc), and the
ratios old/new. Then the worst bodies found for the reader (one token per two or three characters), read at the
cap as the service reads them, in seconds per MiB.
"""

from __future__ import annotations

import argparse
import ast
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlctl.trajectories.literals import MAX_LITERAL_CHARS, LiteralError, loads_lenient  # noqa: E402

MIB = 1 << 20


def flat_list(size: int) -> str:
    item = "'item', "
    return "[" + item * (size // len(item)) + "]"


def dict_of_strings(size: int) -> str:
    entries, total, index = [], 2, 0
    while total < size:
        entry = f"'key{index}': 'value number {index}', "
        entries.append(entry)
        total += len(entry)
        index += 1
    return "{" + "".join(entries) + "}"


def measure(read: Callable[[str], Any], text: str, repeats: int) -> tuple[float, float]:
    """Median seconds over `repeats` and the peak traced memory of one read (MB)."""
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        read(text)
        seconds.append(time.perf_counter() - started)
    tracemalloc.start()
    read(text)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return statistics.median(seconds), peak / 1e6


def lenient_or_refused(text: str) -> Any:
    try:
        return loads_lenient(text)
    except LiteralError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    size = int(args.mib * MIB)
    print(f"bodies of {size} characters, median of {args.repeats}; peak = tracemalloc's peak of one read")
    for name, text in (("flat list", flat_list(size)), ("dict of strings", dict_of_strings(size))):
        assert ast.literal_eval(text) == loads_lenient(text, max_chars=None)  # the same value from both
        old_s, old_mb = measure(ast.literal_eval, text, args.repeats)
        new_s, new_mb = measure(lambda t: loads_lenient(t, max_chars=None), text, args.repeats)
        print(
            f"{name:16s} ast.literal_eval {old_s:7.3f} s {old_mb:8.1f} MB | loads_lenient {new_s:7.3f} s "
            f"{new_mb:7.1f} MB | {old_s / new_s:6.1f}x faster, {old_mb / new_mb:6.1f}x less memory"
        )
    cap = MAX_LITERAL_CHARS
    worst = {
        "one-char strings": "[" + "'a'," * (cap // 4 - 1) + "]",
        "words": "[" + "None," * (cap // 5 - 1) + "]",
        "nesting at the cap": "[" * 64 + "'x', " * ((cap - 200) // 5) + "]" * 64,
        "escapes": "['" + "\\x41" * ((cap - 8) // 4) + "']",
        "mixed quotes": "[" + "'a', \"b\", " * ((cap - 8) // 10) + "]",
        "refused (a name)": "['a', " * ((cap - 8) // 6) + "b]",
    }
    for name, text in worst.items():
        assert len(text) <= cap
        seconds, peak = measure(lenient_or_refused, text, args.repeats)
        print(f"worst at the cap: {name:20s} {seconds * 1000:7.2f} ms = {seconds * MIB / len(text):5.3f} s/MiB, "
              f"{peak:5.1f} MB")  # fmt: skip


if __name__ == "__main__":
    main()
