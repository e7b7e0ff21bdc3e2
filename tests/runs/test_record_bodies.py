"""GET /runs/{id} sends a body kept by what it is made of (rlctl/service/runs/record_bodies.py): each change of the
run's row, its processes or its trainer's state shows at the next read, and the body is the record the agent
tools read. SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import update

from rlctl.service.db.engine import Database
from rlctl.service.db.models import Run, RunProcess
from rlctl.service.runs import service as runs
from rlctl.service.runs.paths import RunPaths
from rlctl.service.runs.record_bodies import RecordBodies
from rlctl.service.schemas import presenting_paths
from rlctl.service.settings import Settings
from tests.runs.test_runs_api import add_runs, make_run
from tests.support.live import Service, in_process_service


@pytest.fixture
def service(make_settings: Callable[..., Settings]) -> Iterator[Service]:
    with in_process_service(make_settings()) as live:
        yield live


def change_run(database_url: str, run_id: str, **values: object) -> None:
    db = Database(database_url)
    with db.session() as session:
        session.execute(update(Run).where(Run.id == run_id).values(**values))
    db.dispose()


def test_each_change_of_what_a_record_is_made_of_shows_at_the_next_read(service: Service, database_url: str) -> None:
    add_runs(database_url, make_run("r1", status="running"))
    state = RunPaths(service.settings.data_path, "r1").trainer_state
    state.parent.mkdir(parents=True, exist_ok=True)
    warning = {"code": "parameter_ignored", "parameter": "beta", "message": "ignored"}
    with service.client() as client:
        first = client.get("/runs/r1")
        assert first.status_code == 200 and client.get("/runs/r1").content == first.content
        change_run(database_url, "r1", last_step=3)  # a column, as the supervisor records a step
        assert client.get("/runs/r1").json()["last_step"] == 3
        offline = {"code": "wandb_offline", "parameter": None, "message": "W&B logs offline"}
        change_run(database_url, "r1", warnings=[offline])  # a JSON column
        assert client.get("/runs/r1").json()["warnings"] == [offline]
        add_runs(database_url, RunProcess(run_id="r1", role="api", pid=12, status="running"))  # another table
        assert [p["pid"] for p in client.get("/runs/r1").json()["processes"]] == [12]
        state.write_text(json.dumps({"warnings": [warning]}))  # the trainer's state file, first written
        assert client.get("/runs/r1").json()["warnings"] == [offline, warning]
        replaced = state.with_suffix(".tmp")  # then replaced by a rename, as the trainer writes it
        replaced.write_text(json.dumps({"warnings": []}))
        os.replace(replaced, state)
        assert client.get("/runs/r1").json()["warnings"] == [offline]
        body = client.get("/runs/r1").json()
    with presenting_paths(service.settings):  # as a tool call shows it
        record = runs.get_run(service.app.state.context, "r1").model_dump(mode="json")
    assert body == record


def test_a_record_reads_anew_after_a_change_within_the_same_instant(service: Service, database_url: str) -> None:
    """Nothing of a record is keyed by its time of change: a row changed twice within one timestamp reads anew."""
    moment = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
    add_runs(database_url, make_run("r2", status="running"))
    with service.client() as client:
        for step in (1, 2):
            change_run(database_url, "r2", last_step=step, updated_at=moment)
            assert client.get("/runs/r2").json()["last_step"] == step


def test_bodies_are_kept_by_their_inputs_the_least_recently_sent_going_first() -> None:
    made: list[str] = []

    def maker(text: str) -> Callable[[], bytes]:
        return lambda: made.append(text) or text.encode()

    bodies = RecordBodies(kept=2)
    assert bodies.body(("a",), maker("a")) == b"a"
    assert bodies.body(("a",), maker("a again")) == b"a"  # the same inputs: the body made before
    bodies.body(("b",), maker("b"))
    bodies.body(("a",), maker("a once more"))  # a was sent last: b goes first
    bodies.body(("c",), maker("c"))
    assert bodies.body(("a",), maker("a kept")) == b"a"
    assert bodies.body(("b",), maker("b made again")) == b"b made again"
    assert made == ["a", "b", "c", "b made again"]
