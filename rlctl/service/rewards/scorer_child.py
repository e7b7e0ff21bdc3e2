"""Child process that imports one environment file and scores completions with its `score_completion`.

Protocol (JSON lines): it first writes `{"ready": true}` (or `{"error": ...}` and exits); then for each input line
`{"completion": str, "answer": any}` it writes `{"score": float}` or `{"error": str}`. It ends at end of input.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any


def load_module(path: Path) -> ModuleType:
    sys.path.insert(0, str(path.parent))  # an environment may import its neighbours
    spec = importlib.util.spec_from_file_location(f"rlctl_scored_env_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gold_of(module: ModuleType, answer: Any) -> Any:
    """The expected answer in the form score_completion compares with."""
    text = answer if isinstance(answer, str) else json.dumps(answer)
    for helper in ("gold_answer", "normalize_number"):
        function = getattr(module, helper, None)
        if callable(function):
            converted = function(text)
            if converted is not None:
                return converted
    return text


def main(argv: list[str]) -> int:
    out = sys.stdout
    sys.stdout = sys.stderr  # whatever the environment prints must not corrupt the protocol
    try:
        module = load_module(Path(argv[1]))
        score = module.score_completion
    except Exception as error:  # noqa: BLE001 - reported to the parent, which fails the job clearly
        out.write(json.dumps({"error": f"{type(error).__name__}: {error}"}) + "\n")
        out.flush()
        return 1
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            value = float(score(str(request["completion"]), gold_of(module, request["answer"])))
            answer: dict[str, float | str] = {"score": value}
        except Exception as error:  # noqa: BLE001 - one bad record is reported, the child goes on
            answer = {"error": f"{type(error).__name__}: {error}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
