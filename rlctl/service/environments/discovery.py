"""Finding environment classes by reading source files, never importing them.

A class counts when it derives from `BaseEnv` or `ToolEnv` (rlctl's base of multi-turn tool environments, itself
a `BaseEnv`: rlctl/environment_kit/tool_env.py), directly or through another class found here (in any scanned
file). Pure functions over source text, plus one scan of directories; the catalog caches per file.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from rlctl.service.pysource import parse_module

ROOT_BASES = frozenset({"BaseEnv", "ToolEnv"})


@dataclass(frozen=True)
class ClassInfo:
    class_name: str
    base_names: tuple[str, ...]
    name_attr: str | None
    description: str
    config_class: str | None


@dataclass(frozen=True)
class FileScan:
    path: Path
    classes: tuple[ClassInfo, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class EnvironmentInfo:
    name: str
    class_name: str
    file_path: Path
    description: str
    config_class: str | None


@dataclass(frozen=True)
class DiscoveryError:
    file_path: Path
    error: str
    name: str = field(default="")


def scan_source(path: Path, source: str) -> FileScan:
    """Read the top-level classes of one file; a file that does not parse is reported, not raised."""
    try:
        tree = parse_module(source, filename=str(path))
    except SyntaxError as exc:
        return FileScan(path, error=f"SyntaxError: {exc.msg} (line {exc.lineno})")
    except ValueError as exc:  # e.g. source with NUL bytes
        return FileScan(path, error=f"ValueError: {exc}")
    classes = tuple(_class_info(node) for node in tree.body if isinstance(node, ast.ClassDef))
    return FileScan(path, classes=classes)


def resolve_environments(
    scans: Iterable[FileScan],
) -> tuple[list[EnvironmentInfo], list[DiscoveryError]]:
    """Environment classes across all scans, and the errors (unparsable files, duplicate names)."""
    scans = list(scans)
    env_class_names = environment_class_names(scans)
    environments: list[EnvironmentInfo] = []
    errors: list[DiscoveryError] = []
    seen: dict[str, EnvironmentInfo] = {}
    for scan in scans:
        if scan.error:
            errors.append(DiscoveryError(scan.path, scan.error, name=scan.path.stem))
            continue
        for info in scan.classes:
            if info.class_name not in env_class_names:
                continue
            env = EnvironmentInfo(
                name=info.name_attr or scan.path.stem,
                class_name=info.class_name,
                file_path=scan.path,
                description=info.description,
                config_class=info.config_class,
            )
            if env.name in seen:
                first = seen[env.name]
                message = (
                    f"duplicate environment name {env.name!r}: already defined by {first.class_name}"
                    f" in {first.file_path}"
                )
                errors.append(DiscoveryError(scan.path, message, name=env.name))
                continue
            seen[env.name] = env
            environments.append(env)
    environments.sort(key=lambda e: e.name)
    errors.sort(key=lambda e: (str(e.file_path), e.error))
    return environments, errors


def environment_files(directories: Iterable[Path]) -> list[Path]:
    """Every `*.py` in the directories (not recursive), skipping names that start with `_`, in a stable order."""
    files: list[Path] = []
    for directory in directories:
        if not directory.is_dir():
            continue
        files.extend(sorted(p for p in directory.glob("*.py") if not p.name.startswith("_") and p.is_file()))
    return files


def environment_class_names(scans: list[FileScan], roots: frozenset[str] = ROOT_BASES) -> set[str]:
    """Fixpoint over base names: BaseEnv (and ToolEnv) subclasses, then their subclasses, across files (or those
    of `roots`)."""
    found = set(roots)
    classes = [info for scan in scans for info in scan.classes]
    changed = True
    while changed:
        changed = False
        for info in classes:
            if info.class_name not in found and any(base in found for base in info.base_names):
                found.add(info.class_name)
                changed = True
    found -= roots
    return found


def is_tool_environment(scans: list[FileScan], class_name: str) -> bool:
    """Whether the class derives from ToolEnv (a multi-turn tool environment), directly or through others."""
    return class_name in environment_class_names(scans, frozenset({"ToolEnv"}))


def _class_info(node: ast.ClassDef) -> ClassInfo:
    docstring = ast.get_docstring(node) or ""
    return ClassInfo(
        class_name=node.name,
        base_names=tuple(name for base in node.bases if (name := _dotted_tail(base))),
        name_attr=_string_class_attribute(node, "name"),
        description=docstring.strip().splitlines()[0].strip() if docstring.strip() else "",
        config_class=_name_class_attribute(node, "env_config_cls"),
    )


def _dotted_tail(expr: ast.expr) -> str | None:
    """`BaseEnv` for `BaseEnv`, `base.BaseEnv` or `atroposlib.envs.base.BaseEnv`; also `Generic[...]` bases."""
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return expr.attr
    if isinstance(expr, ast.Subscript):
        return _dotted_tail(expr.value)
    return None


def _class_assignments(node: ast.ClassDef, attribute: str) -> Iterable[ast.expr]:
    for statement in node.body:
        if isinstance(statement, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == attribute for t in statement.targets):
                yield statement.value
        elif (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and statement.target.id == attribute
            and statement.value is not None
        ):
            yield statement.value


def _string_class_attribute(node: ast.ClassDef, attribute: str) -> str | None:
    value = None
    for expr in _class_assignments(node, attribute):
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str) and expr.value:
            value = expr.value
    return value


def _name_class_attribute(node: ast.ClassDef, attribute: str) -> str | None:
    value = None
    for expr in _class_assignments(node, attribute):
        value = _dotted_tail(expr) or value
    return value
