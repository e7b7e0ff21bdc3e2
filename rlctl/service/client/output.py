"""Human-readable output: aligned tables, key/value blocks, and a live progress line."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TextIO

MAX_CELL = 60  # for free text and JSON in tables; ids, paths and numbers are never cut
TRUNCATED_COLUMNS = frozenset({"description", "error", "message"})


def print_json(value: Any, stream: TextIO | None = None) -> None:
    print(json.dumps(value, indent=2, sort_keys=True, default=str), file=stream or sys.stdout)


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict | list):
        return _cut(json.dumps(value, default=str))
    return _short_time(value) if isinstance(value, str) else str(value)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def _short_time(text: str) -> str:
    """ISO-8601 timestamps as `2026-11-30 12:00:05` (UTC), everything else unchanged."""
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return text
    return parsed.strftime("%Y-%m-%d %H:%M:%S") if "T" in text else text


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str], headers: Sequence[str] | None = None) -> str:
    headers = list(headers or columns)
    cells = [[_cut(cell(row.get(c))) if c in TRUNCATED_COLUMNS else cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def generic_table(items: Sequence[dict[str, Any]], preferred: Sequence[str] = ()) -> str:
    """For records whose shape this client does not fix: the preferred columns present, else the scalar ones."""
    if not items:
        return "(none)"
    present = [c for c in preferred if any(c in item for item in items)]
    if not present:
        present = [k for k, v in items[0].items() if not isinstance(v, dict | list)][:8]
    return table(items, present)


def key_values(pairs: Sequence[tuple[str, Any]]) -> str:
    width = max((len(name) for name, _ in pairs), default=0)
    return "\n".join(f"{name.ljust(width)}  {cell(value)}" for name, value in pairs)


class Progress:
    """One status line on stderr: rewritten in place on a terminal, a new line per change otherwise."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.interactive = self.stream.isatty()
        self.last = ""

    def update(self, text: str) -> None:
        if text == self.last:
            return
        if self.interactive:
            self.stream.write("\r\033[K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self.last = text

    def done(self) -> None:
        if self.interactive and self.last:
            self.stream.write("\n")
            self.stream.flush()


def bar(done: int, total: int | None, width: int = 20) -> str:
    if not total:
        return f"{done}"
    filled = min(width, int(width * done / total))
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {100 * done / total:.0f}%"
