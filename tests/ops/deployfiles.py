"""Readers for the Dockerfile and docker-compose.yml, for tests that check them without a Docker engine.

They implement the parts of the formats these files use: Dockerfile instructions with line continuations,
JSON (exec) and shell forms, stages; compose variable interpolation (`${VAR}`, `${VAR:-default}`,
`${VAR-default}`, `${VAR:?message}`, `$$`), `env_file` lines, and the precedence of a container's environment.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
_VARIABLE = re.compile(r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:-|-|:\?|\?)(?P<arg>[^}]*))?\}")


# --- Dockerfile ---


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str

    def exec_form(self) -> list[str] | None:
        """The JSON array form's items, or None for the shell form."""
        try:
            value = json.loads(self.arguments)
        except ValueError:
            return None
        return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None

    def env(self) -> dict[str, str]:
        """ENV values in order, `$VAR` references to earlier values resolved, unknown ones left as written."""
        values: dict[str, str] = {}
        for instruction in self.all("ENV"):
            for assignment in shlex.split(instruction.arguments):
                name, _, raw = assignment.partition("=")
                values[name] = re.sub(r"\$(\w+)", lambda m: values.get(m.group(1), m.group(0)), raw)
        return values


@dataclass
class Dockerfile:
    arguments: dict[str, str]  # ARG defaults before the first FROM
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def stage_names(self) -> set[str]:
        return {s.name for s in self.stages if s.name}


def read_dockerfile(path: Path) -> Dockerfile:
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        logical.append(pending + line)
        pending = ""
    arguments: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "FROM":
            parts = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: arguments.get(m.group(1), m.group(0)), parts[0])
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(base, name))
        elif not stages and keyword == "ARG":
            name, _, default = rest.partition("=")
            arguments[name] = default
        elif stages:
            stages[-1].instructions.append(Instruction(keyword, rest))
    return Dockerfile(arguments, stages)


def copy_sources(instruction: Instruction) -> tuple[str | None, list[str]]:
    """(the --from stage or None, the source paths) of a COPY instruction."""
    words = shlex.split(instruction.arguments)
    stage = next((w.split("=", 1)[1] for w in words if w.startswith("--from=")), None)
    paths = [w for w in words if not w.startswith("--")]
    return stage, paths[:-1]


def healthcheck_command(instruction: Instruction) -> list[str]:
    """The command of `HEALTHCHECK [options] CMD [...]`, in exec form."""
    _, _, command = instruction.arguments.partition("CMD ")
    value = json.loads(command)
    assert isinstance(value, list), "HEALTHCHECK CMD should use the exec form"
    return value


# --- shell commands that run rlctl ---


def rlctl_invocations(command: list[str]) -> list[list[str]]:
    """The `rlctl ...` argument lists in a command: `["sh", "-c", "a && exec b"]` or a plain exec form."""
    shell_script = command[:2] == ["sh", "-c"]
    steps = [shlex.split(step) for step in command[2].split("&&")] if shell_script else [command]
    invocations = []
    for words in steps:
        if words and words[0] == "exec":
            words = words[1:]
        assert words and words[0] == "rlctl", f"expected an rlctl command, got {words}"
        invocations.append(words[1:])
    return invocations


# --- compose ---


def interpolate(value: Any, variables: dict[str, str]) -> Any:
    """Compose's variable interpolation over every string of a loaded compose file."""
    if isinstance(value, dict):
        return {k: interpolate(v, variables) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, variables) for v in value]
    if not isinstance(value, str):
        return value

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, argument = match.group("name"), match.group("op"), match.group("arg") or ""
        given = variables.get(name)
        if op == ":-":
            return given if given else argument
        if op == "-":
            return argument if given is None else given
        if op in (":?", "?") and (given is None or (op == ":?" and not given)):
            raise ValueError(f"required variable {name} is missing: {argument}")
        return given or ""

    return _VARIABLE.sub(replace, value)


def referenced_variables(text: str) -> dict[str, str | None]:
    """Each `${NAME...}` in a file, with its operator (`:-`, `-`, `:?`, or None for a bare reference)."""
    return {m.group("name"): m.group("op") for m in _VARIABLE.finditer(text) if m.group("name")}


def load_compose(path: Path, variables: dict[str, str] | None = None) -> dict[str, Any]:
    return interpolate(yaml.safe_load(path.read_text()), variables or {})


def read_env_file(path: Path) -> dict[str, str]:
    """`NAME=value` lines; comments and blank lines skipped; quotes around a value removed."""
    values = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, separator, value = line.partition("=")
        assert separator, f"{path}: not NAME=value: {line!r}"
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[name.strip()] = value
    return values


def env_files(service: dict[str, Any]) -> list[str]:
    entries = service.get("env_file") or []
    entries = [entries] if isinstance(entries, str | dict) else entries
    return [entry["path"] if isinstance(entry, dict) else entry for entry in entries]


def environment_of(service: dict[str, Any]) -> dict[str, str]:
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) for item in environment)
    return {str(k): "" if v is None else str(v) for k, v in environment.items()}


def container_environment(
    image_env: dict[str, str], service: dict[str, Any], env_file_values: dict[str, str]
) -> dict[str, str]:
    """What the container sees: the image's ENV, overridden by env_file, overridden by `environment`."""
    return {**image_env, **env_file_values, **environment_of(service)}
