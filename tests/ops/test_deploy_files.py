"""The Dockerfile and docker-compose.yml, checked without a Docker engine: their structure, and that every path,
command and variable they use exists in this project."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from rlctl.service.cli import build_parser, cmd_db_upgrade, cmd_serve
from rlctl.service.settings import SECRET_ENV_NAMES, Settings
from tests.architecture.layers import WINGS, wing_directory
from tests.ops.deployfiles import (
    REPO_ROOT,
    container_environment,
    copy_sources,
    env_files,
    healthcheck_command,
    load_compose,
    read_dockerfile,
    read_env_file,
    referenced_variables,
    rlctl_invocations,
)

DOCKERFILE = REPO_ROOT / "Dockerfile"
COMPOSE = REPO_ROOT / "docker-compose.yml"
# The service's packages and what it reads beside them at run time: every wing of the import rules
# (environments and migrations among them), and the project file.
RUNTIME_TREES = {wing_directory(wing).relative_to(REPO_ROOT).parts[0] for wing in WINGS} | {"pyproject.toml"}
# Variables of other programs that these files may set (Python's, PostgreSQL's image, the tinker SDK's).
FOREIGN_VARIABLES = {"PATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "TINKER_BASE_URL"}
POSTGRES_IMAGE_VARIABLES = {"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB"}
# Interpolated from the shell or compose's .env; each has a default so nothing is required but rlctl.env.
COMPOSE_VARIABLES = {"POSTGRES_PASSWORD", "RLCTL_PORT"}


def setting_variables() -> set[str]:
    """Every environment variable Settings reads: RLCTL_<FIELD> and the conventional secret names."""
    names = {f"RLCTL_{name.upper()}" for name in Settings.model_fields}
    for field in Settings.model_fields.values():
        alias = field.validation_alias
        names |= {choice for choice in getattr(alias, "choices", []) if isinstance(choice, str)}
    return names | SECRET_ENV_NAMES


def parse_rlctl(arguments: list[str]):  # type: ignore[no-untyped-def]
    return build_parser().parse_args(arguments)


def check_start_command(command: list[str]) -> int:
    """Migrations, then the service on all interfaces: returns the port it serves on."""
    upgrade, serve = (parse_rlctl(words) for words in rlctl_invocations(command))
    assert upgrade.handler is cmd_db_upgrade and upgrade.revision == "head"
    assert serve.handler is cmd_serve and serve.host == "0.0.0.0"
    return serve.port


# --- Dockerfile ---


def test_dockerfile_is_multi_stage_slim_and_non_root() -> None:
    dockerfile = read_dockerfile(DOCKERFILE)
    assert len(dockerfile.stages) >= 2 and all(stage.name for stage in dockerfile.stages)
    runtime = dockerfile.final
    assert "slim" in runtime.base
    assert not any("build-essential" in run.arguments for run in runtime.all("RUN")), "compilers stay in the builder"
    user = runtime.last("USER")
    assert user is not None and user.arguments not in ("root", "0", "0:0")
    assert any("useradd" in run.arguments and user.arguments in run.arguments for run in runtime.all("RUN"))
    keywords = [i.keyword for i in runtime.instructions]
    assert keywords.index("USER") < keywords.index("CMD"), "the service must not start as root"


def test_dockerfile_paths_exist_and_the_runtime_gets_everything_the_service_reads() -> None:
    dockerfile = read_dockerfile(DOCKERFILE)
    copied: set[str] = set()
    for stage in dockerfile.stages:
        for instruction in stage.all("COPY"):
            source_stage, sources = copy_sources(instruction)
            if source_stage is not None:
                assert source_stage in dockerfile.stage_names(), f"COPY --from={source_stage}: no such stage"
                continue
            for source in sources:
                assert (REPO_ROOT / source).exists(), f"COPY {source}: not in the repository"
                copied.add(source)
    assert copied >= RUNTIME_TREES
    ignored = {line.strip() for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()}
    assert {".venv", "var", ".git", ".env", "rlctl.env"} <= ignored, "no local state or secret in the build context"
    assert not (copied & ignored)
    # pip installs exactly what pyproject pins; the builder reads its dependency list from there.
    assert any("pyproject.toml" in run.arguments for run in dockerfile.stages[0].all("RUN"))


def test_dockerfile_volume_health_check_and_command_agree() -> None:
    runtime = read_dockerfile(DOCKERFILE).final
    env = runtime.env()
    volume = runtime.last("VOLUME")
    assert volume is not None and volume.exec_form() == [env["RLCTL_DATA_DIR"]]
    for name in env:
        assert name.startswith("RLCTL_") and name in setting_variables() or name in FOREIGN_VARIABLES, name
    port = check_start_command(runtime.last("CMD").exec_form())  # type: ignore[union-attr,arg-type]
    assert runtime.last("EXPOSE").arguments == str(port)  # type: ignore[union-attr]
    # the health check asks the image's probe listener, on loopback (its default host): it does not queue behind
    # the API's requests
    health = healthcheck_command(runtime.last("HEALTHCHECK"))  # type: ignore[arg-type]
    probe_port = int(env["RLCTL_PROBE_PORT"])
    assert probe_port != port and "RLCTL_PROBE_HOST" not in env
    assert health[0] == "python" and f"http://127.0.0.1:{probe_port}/readyz" in health[-1]
    assert "--start-period" in runtime.last("HEALTHCHECK").arguments  # type: ignore[union-attr]


# --- docker-compose.yml ---


def test_compose_structure() -> None:
    compose = load_compose(COMPOSE)
    assert set(compose) <= {"name", "services", "volumes", "networks"}
    services = compose["services"]
    assert set(services) == {"postgres", "rlctl"}
    declared_volumes = set(compose["volumes"])
    for name, service in services.items():
        assert "image" in service or "build" in service, name
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            assert source in declared_volumes, f"{name}: volume {source} is not declared"
            assert target.startswith("/")

    database = services["postgres"]
    assert "postgres-data:/var/lib/postgresql/data" in database["volumes"]
    test = database["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL" and "pg_isready" in test[1]

    service = services["rlctl"]
    build = REPO_ROOT / service["build"]
    assert (build / "Dockerfile").samefile(DOCKERFILE)
    assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
    port = check_start_command(service["command"])
    published = service["ports"][0].rsplit(":", 1)
    assert published[1] == str(port) and published[0].startswith("127.0.0.1:"), "published on loopback only"
    environment = service["environment"]
    data_volume = next(v for v in service["volumes"] if v.endswith(":" + environment["RLCTL_DATA_DIR"]))
    assert data_volume.split(":")[0] in compose["volumes"]
    assert read_dockerfile(DOCKERFILE).final.last("VOLUME").exec_form() == [environment["RLCTL_DATA_DIR"]]  # type: ignore[union-attr]


def test_compose_database_url_names_the_database_service() -> None:
    compose = load_compose(COMPOSE, {"POSTGRES_PASSWORD": "pw-from-shell"})
    database, service = compose["services"]["postgres"], compose["services"]["rlctl"]
    url = make_url(service["environment"]["RLCTL_DATABASE_URL"])
    assert url.get_backend_name() == "postgresql"
    assert url.host == "postgres" and url.port == 5432
    assert url.username == database["environment"]["POSTGRES_USER"]
    assert url.password == database["environment"]["POSTGRES_PASSWORD"] == "pw-from-shell"
    assert url.database == database["environment"]["POSTGRES_DB"]
    assert f"-U {url.username} -d {url.database}" in database["healthcheck"]["test"][1]


def test_compose_variables_and_env_file_exist_in_the_project() -> None:
    text = COMPOSE.read_text()
    references = referenced_variables(text)
    assert set(references) == COMPOSE_VARIABLES
    assert all(op == ":-" for op in references.values()), "every interpolated variable has a default"
    compose = load_compose(COMPOSE)
    service = compose["services"]["rlctl"]
    known = setting_variables()
    assert set(compose["services"]["postgres"]["environment"]) <= POSTGRES_IMAGE_VARIABLES
    assert set(service["environment"]) <= known
    for name in env_files(service):
        example = REPO_ROOT / f"{name}.example"
        assert example.exists(), f"{name}: ship {example.name} for people to copy"
        ignored = subprocess.run(["git", "check-ignore", "-q", name], cwd=REPO_ROOT, check=False)
        assert ignored.returncode == 0, f"{name} holds secrets: it must be git-ignored"
        values = read_env_file(example)
        assert "RLCTL_API_TOKEN" in values and not values["RLCTL_API_TOKEN"], "no token is shipped"
        assert set(values) <= known
        commented = {line[2:].split("=")[0] for line in example.read_text().splitlines() if line.startswith("# ")}
        assert {"TINKER_API_KEY", "WANDB_API_KEY", "OPENROUTER_API_KEY"} <= commented


@pytest.mark.e2e
def test_the_example_env_file_alone_does_not_expose_the_service(tmp_path: Path) -> None:
    """The compose command binds 0.0.0.0; with the example's empty token, the service refuses to start."""
    compose = load_compose(COMPOSE)
    service = compose["services"]["rlctl"]
    env = container_environment(
        read_dockerfile(DOCKERFILE).final.env(), service, read_env_file(REPO_ROOT / "rlctl.env.example")
    )
    env.update(RLCTL_DATA_DIR=str(tmp_path), RLCTL_DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite'}")
    serve = rlctl_invocations(service["command"])[-1]
    result = subprocess.run(
        [sys.executable, "-m", "rlctl.service.cli", *serve],
        env={**env, "PATH": os.environ["PATH"]},  # the image's PATH names its venv; this runs the checkout's
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "RLCTL_API_TOKEN" in result.stderr


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker client")
def test_docker_compose_accepts_the_file_when_the_plugin_is_installed(tmp_path: Path) -> None:
    plugin = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, check=False)
    if plugin.returncode != 0:
        pytest.skip("the docker compose plugin is not installed here")
    project = tmp_path / "project"
    shutil.copytree(REPO_ROOT, project, ignore=shutil.ignore_patterns(".venv", ".git", "var", "*.db"))
    (project / "rlctl.env").write_text("RLCTL_API_TOKEN=compose-config-check\n")
    result = subprocess.run(
        ["docker", "compose", "config", "--quiet"], cwd=project, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
