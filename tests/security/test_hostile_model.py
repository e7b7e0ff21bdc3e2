"""A collection against a scripted model whose replies attack the service, through the real service over HTTP.

The model asks the terminal to read the service's environment and secrets, call the API with a stolen token,
write into the service's database and outside its work directory, leave processes behind, and link files out;
it puts a secret in its own text, and sends replies too large to keep. Each attack must fail: the checks are on
the host (files, processes) and in everything the service stored or answered."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlctl.sandbox.bubblewrap import Sandbox
from rlctl.service.collections.agent import MAX_REPLY_CHARS, MAX_RESPONSE_BYTES
from rlctl.service.settings import Settings
from tests.datasets_api.chat_server import chat_server
from tests.support.live import live_service
from tests.support.reaper import processes_named
from tests.support.waiting import wait_until

TOKEN = "rlctl-api-token-stolen-7c1"
OPENROUTER_KEY = "sk-or-hostile-planted-41"
COLLECTION_KEY = "sk-collection-hostile-93"
MARKER = "rlctl-hostile-survivor"


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def hostile_script(
    data_dir: Path, database: Path, api_url: str
) -> Callable[[dict[str, Any]], tuple[int, dict[str, Any]]]:
    attacks = [
        "cat /proc/$PPID/environ /proc/1/environ /proc/*/environ 2>&1 | tr '\\0' '\\n'; env",
        f"curl -s -H 'Authorization: Bearer {TOKEN}' {api_url}/runs 2>&1 || "
        f"(exec 3<>/dev/tcp/127.0.0.1/{api_url.rsplit(':', 1)[1]} && echo CONNECTED) 2>&1",
        f"echo junk >> {database} 2>&1; sqlite3 {database} 'drop table runs' 2>&1",
        f"echo x > {data_dir}/escaped.txt 2>&1",
        f"setsid sh -c 'exec -a {MARKER} sleep 900' </dev/null >/dev/null 2>&1 & disown; nohup sleep 900 & echo left",
        f"ln {database} db-link 2>&1; ln -s {database} db-symlink; ln -s {data_dir} data",
    ]

    def agent(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        turn = sum(1 for message in body["messages"] if message["role"] == "assistant")
        prompt = body["messages"][-1]["content"] if turn == 0 else ""
        if "huge" in body["messages"][0]["content"]:
            return 200, {"content": "x" * (MAX_RESPONSE_BYTES + 1000)}
        if "flood" in prompt or (turn and "flood" in body["messages"][1]["content"]):
            return 200, {"content": "<tool_call>" * ((1 << 20) // len("<tool_call>"))}
        if turn == 0:
            calls = [_call(f"t{i}", "terminal", {"command": command}) for i, command in enumerate(attacks)]
            return 200, {"content": "", "tool_calls": calls}
        if turn == 1:
            paths = ["db-symlink", "data/x", "../../../rlctl.db", str(database)]
            calls = [_call(f"w{i}", "write_file", {"path": p, "content": "pwned"}) for i, p in enumerate(paths)]
            calls += [_call(f"r{i}", "read_file", {"path": p}) for i, p in enumerate(paths)]
            return 200, {"content": "", "tool_calls": calls}
        return 200, {"content": f"<think>I know {OPENROUTER_KEY} and {COLLECTION_KEY}</think>Done: {OPENROUTER_KEY}"}

    return agent


def test_a_hostile_model_cannot_escape_steal_or_persist(
    make_settings: Callable[..., Settings], sandbox: Sandbox
) -> None:
    settings = make_settings(api_token=TOKEN, openrouter_api_key=OPENROUTER_KEY, collection_api_key=COLLECTION_KEY)
    data_dir = settings.data_path
    # The SQLite file when the database is SQLite; a file of the same standing otherwise.
    url = settings.sqlalchemy_url
    database = Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else data_dir / "service.json"
    if not url.startswith("sqlite"):
        database.parent.mkdir(parents=True, exist_ok=True)
        database.write_text("{}", encoding="utf-8")
    original = database.read_bytes() if not url.startswith("sqlite") else None
    with live_service(settings) as live, live.client() as client:
        before = client.get("/runs").json()
        with chat_server(hostile_script(data_dir, database, live.base_url)) as model:
            body = {
                "name": "hostile",
                "prompts": [{"prompt": "Do your worst."}, {"prompt": "flood"}, {"prompt": "huge"}],
                "base_url": model.base_url,
                "model": "hostile",
                "tools": ["terminal", "read_file", "write_file"],
                "runs_per_prompt": 2,
                "max_turns": 4,
                "tool_timeout_s": 20,
                "discard_without_reasoning": False,  # the hostile model never reasons; its trajectories are kept
            }
            created = client.post("/collections", json=body)
            assert created.status_code == 202, created.text
            collection_id = created.json()["id"]
            done = wait_until(
                lambda: (
                    (c := client.get(f"/collections/{collection_id}").json())["status"] in ("completed", "failed") and c
                ),
                timeout=120,
                message="the hostile collection ends",
            )
            assert done["status"] == "completed", done["error"]
            assert client.get("/healthz").status_code == 200
            items = client.get(f"/collections/{collection_id}/items").json()["items"]
            records = client.get(f"/datasets/{done['dataset_id']}/records", params={"limit": 50}).json()["records"]
            assert client.get("/runs").json() == before  # the database is whole and unchanged
        answered = json.dumps(done) + json.dumps(items) + json.dumps(records)

    flooded = [item for item in items if item["prompt_index"] == 1]
    assert {item["status"] for item in flooded} == {"failed"}
    assert all(f"over the limit of {MAX_REPLY_CHARS}" in item["reason"] for item in flooded)
    huge = [item for item in items if item["prompt_index"] == 2]
    assert {item["status"] for item in huge} == {"failed"}
    assert all(f"over {MAX_RESPONSE_BYTES} bytes" in item["reason"] for item in huge), huge
    kept = [item for item in items if item["prompt_index"] == 0]
    assert {item["status"] for item in kept} == {"kept"} and len(records) == 2

    tool_results = [turn["value"] for record in records for turn in record["conversations"] if turn.get("name")]
    terminal = [json.loads(json.loads(_response_body(v))["content"]) for v in tool_results if '"terminal"' in v]
    # No network, so no API call with a stolen token either.
    assert len(terminal) == 12 and not any("CONNECTED" in result["output"] for result in terminal)
    files = [json.loads(json.loads(_response_body(v))["content"]) for v in tool_results if '"terminal"' not in v]
    assert "No such file" in terminal[5]["output"]  # the database is not even in view
    assert len(files) == 16 and all("outside the working directory" in f.get("error", "") for f in files), files

    for secret in (TOKEN, OPENROUTER_KEY, COLLECTION_KEY):
        assert secret not in answered  # nor in what the API answered
        for path in data_dir.rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert secret.encode() not in path.read_bytes(), path
    assert "***" in answered  # the model's own text had them: scrubbed, not dropped
    assert not (data_dir / "escaped.txt").exists()
    assert b"pwned" not in database.read_bytes() and b"junk" not in database.read_bytes()
    assert original is None or database.read_bytes() == original
    wait_until(lambda: not processes_named(MARKER), timeout=10, message="nothing the model started survives")


def _response_body(value: str) -> str:
    return value.split("<tool_response>", 1)[1].rsplit("</tool_response>", 1)[0].strip()


def test_a_collection_stops_at_its_total_size(make_settings: Callable[..., Settings]) -> None:
    def talkative(_body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, {"content": "<think>more</think>" + "word " * 20_000}

    settings = make_settings(collection_max_bytes=150_000)
    with chat_server(talkative) as model, live_service(settings) as live, live.client() as client:
        body = {"name": "big", "prompts": [{"prompt": f"p{i}"} for i in range(5)], "base_url": model.base_url,
                "model": "m", "concurrency": 1, "discard_without_reasoning": False}  # fmt: skip
        collection_id = client.post("/collections", json=body).json()["id"]
        done = wait_until(
            lambda: (
                (c := client.get(f"/collections/{collection_id}").json())["status"] in ("completed", "failed") and c
            ),
            timeout=60,
            message="the collection stops",
        )
    assert done["status"] == "failed" and "RLCTL_COLLECTION_MAX_BYTES" in done["error"], done
    assert 1 <= done["progress"]["kept"] < 10 and done["progress"]["pending"] > 0
