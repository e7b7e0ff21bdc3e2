"""The routes a run's node reports through (docs/RAY.md#authentication): only the run's own secret opens them.

The two-node Ray test (test_ray_runs.py) drives them end to end; here, quickly and on each database, every way of
knocking without the right secret is refused alike, and the API token is no key to them.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import update

from rlctl.service.db.engine import Database
from rlctl.service.db.models import Run
from rlctl.service.runs.node import BAD_SECRET, secret_hash
from rlctl.service.settings import Settings
from tests.ops.seeding import SeededRun, seed_run
from tests.support.live import in_process_service

TOKEN = "api-token-of-the-test"
RUN_SECRET = "the-run-secret-of-the-test"


def give_secret(settings: Settings, run_id: str) -> None:
    db = Database(settings.sqlalchemy_url)
    try:
        with db.session() as session:
            session.execute(update(Run).where(Run.id == run_id).values(node_secret_hash=secret_hash(RUN_SECRET)))
    finally:
        db.dispose()


def test_only_the_run_secret_opens_the_node_routes(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(api_token=TOKEN)
    run = seed_run(settings, SeededRun(status="running", process_status="running"))
    give_secret(settings, run.id)
    plan, report = f"/runs/{run.id}/node/plan", f"/runs/{run.id}/node/report"
    with in_process_service(settings) as service, service.client(token=TOKEN) as client:
        knocks = {
            "no secret, the API token": client.get(plan),
            "a wrong secret": client.get(plan, headers={"X-Rlctl-Run-Secret": "guess"}),
            "the API token as the secret": client.get(plan, headers={"X-Rlctl-Run-Secret": TOKEN}),
            "the stored hash as the secret": client.get(plan, headers={"X-Rlctl-Run-Secret": secret_hash(RUN_SECRET)}),
            "another run's id": client.get("/runs/unknown-run/node/plan", headers={"X-Rlctl-Run-Secret": RUN_SECRET}),
            "a report without the secret": client.post(report, json={}),
        }
        for knock, response in knocks.items():
            assert response.status_code == 401, (knock, response.text)
            assert response.json()["error"]["message"] == BAD_SECRET, knock  # an unknown run reads the same
        # The right secret, but the run is not starting (a stop cancelled its start): no plan, the secret unspent.
        late = client.get(plan, headers={"X-Rlctl-Run-Secret": RUN_SECRET})
        assert late.status_code == 409 and late.json()["error"]["code"] == "CONFLICT", late.text
        assert "not starting" in late.json()["error"]["message"]
        # The right secret is accepted; this control plane runs nothing on Ray, so a report has nowhere to go.
        refused = client.post(report, json={}, headers={"X-Rlctl-Run-Secret": RUN_SECRET})
        assert refused.status_code == 409, refused.text
        shown = client.get(f"/runs/{run.id}")
        assert shown.status_code == 200
        assert secret_hash(RUN_SECRET) not in shown.text and RUN_SECRET not in shown.text
        schema = client.get("/openapi.json").json()
        assert not any("/node/" in path for path in schema["paths"]), "internal routes stay out of the document"
