"""A lenient, linear-time reader of Python-literal-ish text: the tool-call bodies some agents print with single
quotes, True/False/None and trailing commas. It replaces ``ast.literal_eval``, which held the interpreter ~2 s and
~900 MB per MiB of hostile body (it builds a full syntax tree first); this one rewrites the text to JSON in one
regular-expression scan (each token matched once, no backtracking across tokens) and lets the C JSON parser build
the value. Pure: no I/O."""

from __future__ import annotations

import json
import re
from typing import Any

MAX_LITERAL_CHARS = 64 * 1024  # a body over this is refused, not tried: the fallback is for short tool-call bodies
MAX_LITERAL_DEPTH = 64  # brackets nested deeper than this are refused (JSON's C parser recurses)


class LiteralError(ValueError):
    """The text is neither JSON nor a Python literal this reader accepts, or is over its limits."""


# Strings use the unrolled loop ``[^q\\]*+(?:\\.[^q\\]*+)*+`` with possessive quantifiers: an unclosed quote costs one
# scan to the end, never a backtracking search.
_STRING = r""""[^"\\]*+(?:\\.[^"\\]*+)*+"|'[^'\\]*+(?:\\.[^'\\]*+)*+'"""
# The whole text as strings and the runs between them, matched once from the start (so a stray quote fails in one
# scan; a search for strings over text that is not this could retry at every quote, quadratic).
_SHAPE = re.compile(rf"""(?:[^"'\\]++|{_STRING})*+""", re.DOTALL)
_STRINGS = re.compile(f"({_STRING})", re.DOTALL)
# What may stand between strings (joined by NUL): numbers, separators, brackets, white space and the constants.
_BETWEEN = re.compile(r"(?:[\s0-9.eE+\-:,\[\]{}()\x00]++|(?:True|False|None|true|false|null)(?![A-Za-z0-9_]))*+")
_TRAILING_COMMA = re.compile(r",(\s*[\]})])")
_BRACKET = re.compile(r"[\[\]{}]")


_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{1,3}|.)", re.DOTALL)
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "v": "\v", "a": "\a", "0": "\0",
                   "\\": "\\", "'": "'", '"': '"', "\n": ""}  # fmt: skip


def loads_lenient(text: str, max_chars: int | None = MAX_LITERAL_CHARS) -> Any:
    """The value of ``text`` read as JSON, else as a Python literal of dicts, lists, tuples (read as lists),
    strings, numbers, True/False/None, with trailing commas allowed. Raises LiteralError when it is neither, when
    a non-JSON text is over ``max_chars`` (None: no cap, for benchmarks) or nests deeper than MAX_LITERAL_DEPTH.
    Time and memory are linear in the text's length."""
    try:
        return json.loads(text)
    except RecursionError as error:  # arrays nested thousands deep
        raise LiteralError("nested too deeply") from error
    except ValueError:
        pass
    if max_chars is not None and len(text) > max_chars:
        raise LiteralError(f"a Python-literal body over {max_chars} characters is not read")
    try:
        return json.loads(to_json(text), strict=False)  # strict=False: raw control characters in strings
    except RecursionError as error:
        raise LiteralError("nested too deeply") from error
    except LiteralError:
        raise
    except ValueError as error:  # the rewrite is not valid JSON (e.g. `{1: 2}` keys, `0x10`): not a literal we read
        raise LiteralError(f"not a literal: {error}") from error


def to_json(text: str) -> str:
    """``text`` rewritten to JSON text; raises LiteralError when it holds anything but strings, numbers, separators,
    brackets and the constants (a name, an operator, a stray quote), or brackets nested deeper than
    MAX_LITERAL_DEPTH. Each step is one pass in C (a match, a split, replaces); Python-level work is at most per
    string (a quote swap), and per bracket only when there are more brackets than the depth cap."""
    if '"' not in text and "\\" not in text:
        # The common shape of a Python repr: every quote opens or closes a string, so a split on it is exact.
        parts = text.split("'")
        if len(parts) % 2 == 0:
            raise LiteralError("an unclosed string")
        parts[0::2] = _between_strings(parts[0::2])
        return '"'.join(parts)
    if _SHAPE.fullmatch(text) is None:
        raise LiteralError("an unclosed string or a backslash outside a string")
    parts = _STRINGS.split(text)  # text between strings, string, text between, …, text between
    parts[0::2] = _between_strings(parts[0::2])
    parts[1::2] = [  # inline, not a call per string: a double-quoted string without escapes is JSON already
        string
        if "\\" not in string and string[0] == '"'
        else '"' + string[1:-1] + '"'
        if "\\" not in string and '"' not in string
        else _json_string(string)
        for string in parts[1::2]
    ]
    return "".join(parts)


def _between_strings(pieces: list[str]) -> list[str]:
    """The text between the strings, checked and rewritten to JSON in one joined pass (NUL marks the strings)."""
    between = "\x00".join(pieces)
    if between.count("\x00") != len(pieces) - 1 or _BETWEEN.fullmatch(between) is None:
        raise LiteralError("not a literal: a name or an operator outside the strings")
    # No letters but these words and e/E are allowed between strings, so a plain replace finds only the words.
    between = between.replace("True", "true").replace("False", "false").replace("None", "null")
    between = _TRAILING_COMMA.sub(r"\1", between.replace("(", "[").replace(")", "]"))  # tuples read as lists
    _check_depth(between)
    return between.split("\x00")


def _check_depth(between: str) -> None:
    if between.count("[") + between.count("{") <= MAX_LITERAL_DEPTH:
        return  # too few brackets to nest deeper
    depth = 0
    for bracket in _BRACKET.findall(between):
        depth += 1 if bracket in "[{" else -1
        if depth > MAX_LITERAL_DEPTH:
            raise LiteralError(f"nested deeper than {MAX_LITERAL_DEPTH}")


def _json_string(literal: str) -> str:
    """A string literal (either quote, Python's escapes) as a JSON string."""
    return json.dumps(_unescape(literal[1:-1]), ensure_ascii=False)


def _unescape(body: str) -> str:
    """A string literal's body with Python's escapes decoded (an unknown escape keeps its backslash, as Python)."""
    return _ESCAPE.sub(_escaped_char, body)


def _escaped_char(match: re.Match[str]) -> str:
    code = match.group(1)
    if code in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[code]
    if code[0] in "xuU" and len(code) > 1:
        value = int(code[1:], 16)
    elif code[0] in "01234567":
        value = int(code, 8)
    else:
        return match.group()
    if value > 0x10FFFF:
        raise LiteralError(f"escape {match.group()!r} is not a character")
    return chr(value)
