"""Environment discovery by AST: what counts as an environment, and what is reported instead."""

from __future__ import annotations

from pathlib import Path

from rlctl.service.environments.discovery import environment_files, resolve_environments, scan_source


def scans(files: dict[str, str]) -> list:
    return [scan_source(Path(f"/envs/{name}"), source) for name, source in files.items()]


def test_direct_and_indirect_subclasses_across_files() -> None:
    environments, errors = resolve_environments(
        scans(
            {
                "base_math.py": "from atroposlib.envs.base import BaseEnv\nclass MathBase(BaseEnv):\n    pass\n",
                "algebra.py": "from base_math import MathBase\nclass Algebra(MathBase):\n    name = 'algebra'\n",
                "deep.py": "import atroposlib.envs.base as b\nclass Deeper(Algebra2):\n    pass\n"
                "class Algebra2(b.BaseEnv):\n    pass\n",
                "plain.py": "class NotAnEnv:\n    pass\nclass Child(NotAnEnv):\n    pass\n",
            }
        )
    )
    assert [e.name for e in errors] == ["deep"]
    found = {(e.name, e.class_name) for e in environments}
    # "deep.py" holds two environments without a `name`: the first keeps the stem, the second is a duplicate.
    assert ("base_math", "MathBase") in found
    assert ("algebra", "Algebra") in found
    assert ("deep", "Deeper") in found
    names = [e.class_name for e in environments]
    assert "Algebra" in names and "MathBase" in names and "Deeper" in names
    assert "NotAnEnv" not in names and "Child" not in names


def test_name_attribute_docstring_and_config_class() -> None:
    source = (
        "from atroposlib.envs.base import BaseEnv\n"
        "class MyEnv(BaseEnv):\n"
        '    """First line of the docstring.\n\n    More text."""\n'
        "    name: str = 'custom'\n"
        "    env_config_cls = MyConfig\n"
    )
    [env], errors = resolve_environments(scans({"file_stem.py": source}))
    assert errors == []
    assert env.name == "custom"
    assert env.description == "First line of the docstring."
    assert env.config_class == "MyConfig"


def test_no_docstring_and_no_name_fall_back_to_file_stem() -> None:
    [env], _ = resolve_environments(scans({"quiet.py": "class Quiet(BaseEnv):\n    name = None\n"}))
    assert env.name == "quiet"
    assert env.description == ""
    assert env.config_class is None


def test_unparsable_file_is_reported_and_the_rest_listed() -> None:
    environments, errors = resolve_environments(
        scans({"broken.py": "class Broken(BaseEnv)\n    pass\n", "good.py": "class Good(BaseEnv):\n    pass\n"})
    )
    assert [e.name for e in environments] == ["good"]
    assert len(errors) == 1
    assert errors[0].name == "broken"
    assert "SyntaxError" in errors[0].error
    assert "line 1" in errors[0].error


def test_nul_bytes_are_reported_not_raised() -> None:
    _, errors = resolve_environments(scans({"nul.py": "class A(BaseEnv):\n    x = '\x00'\n"}))
    assert len(errors) == 1


def test_duplicate_names_keep_the_first_and_report_the_second() -> None:
    environments, errors = resolve_environments(
        scans(
            {
                "a.py": "class A(BaseEnv):\n    name = 'same'\n",
                "b.py": "class B(BaseEnv):\n    name = 'same'\n",
            }
        )
    )
    assert [(e.name, e.class_name) for e in environments] == [("same", "A")]
    assert "duplicate environment name 'same'" in errors[0].error


def test_listing_is_sorted_by_name() -> None:
    environments, _ = resolve_environments(
        scans({"z.py": "class Z(BaseEnv):\n    pass\n", "a.py": "class A(BaseEnv):\n    name = 'm'\n"})
    )
    assert [e.name for e in environments] == ["m", "z"]


def test_environment_files_skip_private_names_and_other_files(tmp_path: Path) -> None:
    (tmp_path / "_private.py").write_text("class P(BaseEnv): pass\n")
    (tmp_path / "notes.txt").write_text("class T(BaseEnv): pass\n")
    (tmp_path / "real.py").write_text("class R(BaseEnv): pass\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "nested.py").write_text("class N(BaseEnv): pass\n")
    assert environment_files([tmp_path, tmp_path / "missing"]) == [tmp_path / "real.py"]


def test_tool_environments_are_environments() -> None:
    source = (
        "from rlctl.environment_kit.tool_env import ToolEnv\n"
        "class Lookup(ToolEnv):\n"
        '    """Look a value up."""\n'
        "    name = 'lookup'\n"
        "class Harder(Lookup):\n"
        "    name = 'harder'\n"
        "class Helper:\n"
        "    pass\n"
    )
    environments, errors = resolve_environments(scans({"tools.py": source}))
    assert errors == []
    assert [(e.name, e.class_name) for e in environments] == [("harder", "Harder"), ("lookup", "Lookup")]


def test_the_shipped_tool_environment_is_listed() -> None:
    shipped = Path(__file__).resolve().parents[2] / "environments"
    files = environment_files([shipped])
    environments, _ = resolve_environments(scan_source(path, path.read_text()) for path in files)
    assert "tool_lookup" in {e.name for e in environments}
