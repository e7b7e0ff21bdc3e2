"""The architecture's figures: import cycles and upward imports inside rlctl/service/, lines by wing, long functions,
and (with --strict) mypy --strict errors by wing.

    .venv/bin/python benchmarks/architecture.py [--strict] [--long 50]

The rules themselves are tests (tests/architecture/test_import_rules.py); this prints where the code stands.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.architecture import layers  # noqa: E402

WINGS = sorted(set(layers.WINGS) - {"migrations"})


def production_lines(path: Path) -> int:
    """Lines that are not blank."""
    return sum(1 for line in path.read_text().splitlines() if line.strip())


def lines_by_wing() -> dict[str, int]:
    counts = {wing: sum(production_lines(path) for path in layers.python_files(wing)) for wing in WINGS}
    service = layers.wing_directory("service")
    for unit in sorted({path.relative_to(service).parts[0] for path in layers.python_files("service")}):
        where = service / unit
        files = sorted(where.rglob("*.py")) if where.is_dir() else [where]
        counts[f"rlctl/service/{unit.removesuffix('.py')}"] = sum(production_lines(path) for path in files)
    return counts


def long_functions(limit: int) -> list[tuple[int, str]]:
    found = []
    for wing in WINGS:
        for path in layers.python_files(wing):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length > limit:
                        found.append((length, f"{path.relative_to(layers.REPO_ROOT)}:{node.lineno} {node.name}"))
    return sorted(found, reverse=True)


def strict_errors(wing: str) -> int:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", wing],
        cwd=layers.REPO_ROOT,
        capture_output=True,
        text=True,
    )
    # errors in the modules the wing imports are reported too: count the wing's own
    return sum(1 for line in result.stdout.splitlines() if re.match(rf"{wing}/.*: error:", line))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strict", action="store_true", help="also count mypy --strict errors by wing (slow)")
    parser.add_argument("--long", type=int, default=50, help="report functions longer than this many lines")
    args = parser.parse_args()

    cycles = layers.unit_cycles()
    violations = layers.layer_violations()
    print(f"import cycles between the parts of rlctl/service/: {len(cycles)}")
    for cycle in cycles:
        print(f"  {' -> '.join(cycle)}")
    print(f"imports against the layers of rlctl/service/ (upward, sideways, kernel to domain): {len(violations)}")
    for violation in violations:
        print(f"  {violation}")
    wing_problems = [problem for wing in layers.WINGS for problem in layers.wing_violations(wing)]
    print(f"imports against the wings' rules: {len(wing_problems)}")
    print("non-blank lines by wing:")
    for name, count in lines_by_wing().items():
        print(f"  {name:32} {count:6}")
    found = long_functions(args.long)
    print(f"functions over {args.long} lines: {len(found)}")
    for length, where in found:
        print(f"  {length:4}  {where}")
    if args.strict:
        print("mypy --strict errors by wing (each wing's own modules):")
        for wing in WINGS:
            print(f"  {wing:14} {strict_errors(wing)}")


if __name__ == "__main__":
    main()
