"""Python source parsed to a syntax tree, one parse at a time in this process.

CPython 3.11 keeps the syntax-tree constructor's recursion counter in interpreter state shared by all threads, so
two threads building trees at once can fail with "SystemError: AST constructor recursion depth mismatch"
(python/cpython#106905). Request threads read environment files concurrently; every parse of the service takes
`PARSE_LOCK`, which costs nothing next to reading the file.
"""

from __future__ import annotations

import ast
import threading

PARSE_LOCK = threading.RLock()  # re-entrant: the test suite routes ast.parse itself through it


def parse_module(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse`, serialised (raises SyntaxError or ValueError as it does)."""
    with PARSE_LOCK:
        return ast.parse(source, filename=filename)
