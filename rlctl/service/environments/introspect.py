"""Run in a child process: import one environment file and describe its config class.

    python -m rlctl.service.environments.introspect FILE CLASS OUTPUT_JSON
    python -m rlctl.service.environments.introspect --batch REQUESTS_JSON OUTPUT_JSON

The API process never imports environment code (it may be slow, crash or hang); this module does, with a
time-out set by the caller. Defaults are the values `config_init()` returns, not the class defaults. The batch
form reads `[[FILE, CLASS], ...]` (files of one directory) and writes one result per pair, in order: atroposlib
and its dependencies, most of a child's seconds, are imported once for all of them.
"""

from __future__ import annotations

import enum
import importlib.util
import json
import sys
import traceback
import types
import typing
from pathlib import Path
from typing import Any

TRACEBACK_LINES = 20  # the tail an author sees when their environment fails to import


def describe(file_path: Path, class_name: str) -> dict[str, Any]:
    env_class = load_environment_class(file_path, class_name)
    env_config, _server_configs = env_class.config_init()
    config_class = type(env_config)
    defaults = env_config.model_dump(mode="json")
    schema = config_class.model_json_schema(mode="validation")
    properties = schema.get("properties", {})
    fields = []
    for name, info in config_class.model_fields.items():
        fields.append(
            {
                "name": name,
                "type": type_name(info.annotation),
                "default": defaults.get(name),
                "description": info.description or "",
                "json_schema": properties.get(name, {}),
                "set_by_init": name in env_config.model_fields_set,
            }
        )
    return {
        "config_class": config_class.__name__,
        "fields": fields,
        "defs": schema.get("$defs", {}),
    }


def type_name(annotation: Any) -> str:
    """A short readable type: `int`, `str | None`, `list[str]`, `EvalHandlingEnum`."""
    if annotation is None or annotation is type(None):
        return "None"
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in typing.get_args(annotation))
    if origin is typing.Literal:
        return "Literal[" + ", ".join(repr(a) for a in typing.get_args(annotation)) + "]"
    if origin is not None:
        args = ", ".join(type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation)


def load_environment_class(file_path: Path, class_name: str) -> type[Any]:
    # Sibling imports (an environment deriving from another file's class) resolve like `python FILE` would.
    sys.path.insert(0, str(file_path.parent))
    spec = importlib.util.spec_from_file_location(f"rlctl_env_{file_path.stem}", file_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {file_path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    env_class = getattr(module, class_name, None)
    if not isinstance(env_class, type):
        raise ImportError(f"{file_path} defines no class {class_name}")
    return env_class


def _json_default(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    return str(value)


def described(file_path: Path, class_name: str) -> dict[str, Any]:
    """The result the parent reads for one class: its description, or the error that stopped it."""
    try:
        return {"ok": True, **describe(file_path, class_name)}
    except BaseException as exc:  # noqa: BLE001 - everything is reported to the parent, nothing raised
        return {
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc().strip().splitlines()[-TRACEBACK_LINES:],
        }


def main(argv: list[str]) -> int:
    if argv[0] == "--batch":
        requests, output = json.loads(Path(argv[1]).read_text()), Path(argv[2])
        results = [described(Path(file), class_name) for file, class_name in requests]
        output.write_text(json.dumps(results, default=_json_default))
        return 0
    file_path, class_name, output = Path(argv[0]), argv[1], Path(argv[2])
    output.write_text(json.dumps(described(file_path, class_name), default=_json_default))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
