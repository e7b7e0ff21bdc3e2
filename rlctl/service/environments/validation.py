"""The checks a written environment's source passes before it is stored, but the import (pure: no I/O).

docs/ENVIRONMENTS.md#writing-environments lists them; the import in a child process comes after these.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from rlctl.service.environments.discovery import FileScan, environment_class_names, scan_source
from rlctl.service.environments.schemas import ValidationCheck
from rlctl.service.pysource import parse_module


def check_source(
    name: str, source: str, path: Path, other_scans: Iterable[FileScan], taken: dict[str, str]
) -> tuple[list[ValidationCheck], str | None]:
    """The checks of `source` as the file `path` of environment `name`, and its class name when they pass.

    `other_scans` are the other environment files (a base class may live there); `taken` maps the names of
    environments that are not managed (shipped or operator-installed) to their files.
    """
    syntax = _syntax(source, path)
    if not syntax.ok:
        return [syntax], None
    checks = [syntax]
    scan = scan_source(path, source)
    env_classes = environment_class_names([*other_scans, scan])
    found = [info.class_name for info in scan.classes if info.class_name in env_classes]
    if len(found) != 1:
        message = (
            "no class derives from BaseEnv"
            if not found
            else f"exactly one BaseEnv subclass per file; found {len(found)}: {', '.join(found)}"
        )
        checks.append(ValidationCheck(check="environment_class", ok=False, message=message))
        return checks, None
    class_name = found[0]
    checks.append(ValidationCheck(check="environment_class", ok=True, message=f"one environment class: {class_name}"))
    info = next(i for i in scan.classes if i.class_name == class_name)
    declared = info.name_attr or path.stem
    if declared != name:
        message = f"the class's name attribute is {declared!r}, not {name!r}: set name = {name!r}"
        checks.append(ValidationCheck(check="name", ok=False, message=message))
        return checks, None
    checks.append(ValidationCheck(check="name", ok=True, message=f"name = {name!r}"))
    if name in taken:
        message = f"{name!r} is a shipped or operator-installed environment ({taken[name]}); choose another name"
        checks.append(ValidationCheck(check="name_clash", ok=False, message=message))
        return checks, None
    checks.append(ValidationCheck(check="name_clash", ok=True, message="no other environment has this name"))
    return checks, class_name


def _syntax(source: str, path: Path) -> ValidationCheck:
    try:
        parse_module(source, filename=path.name)
    except SyntaxError as exc:
        return ValidationCheck(check="syntax", ok=False, message=exc.msg, line=exc.lineno, column=exc.offset)
    except ValueError as exc:  # NUL bytes
        return ValidationCheck(check="syntax", ok=False, message=str(exc))
    return ValidationCheck(check="syntax", ok=True, message="parses")
