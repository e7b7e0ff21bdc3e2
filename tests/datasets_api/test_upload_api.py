"""Uploads over HTTP: every real public trajectory file in every way it can come, stats that agree with the pure
logic, paging, export round trips, and bad input refused with nothing stored."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

from rlctl.service.settings import Settings
from rlctl.trajectories.importing import ImportedRecord
from rlctl.trajectories.stats import DatasetStats, compute_record_stats
from rlctl.trajectories.tokens import ApproximateTokenCounter
from tests.datasets.realdata import EXPECTED_FILES, import_file
from tests.datasets.test_importing import BATCH_RUNNER_RECORD
from tests.datasets_api.conftest import upload, wait_job
from tests.support.live import Service, in_process_service

TAU = "tau-bench-gpt-4o-airline.json"
GOOD = {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}], "answer": "4"}


def stored_dataset_dirs(settings: Settings) -> list[Path]:
    root = settings.data_path / "datasets"
    if not root.is_dir():
        return []
    return [entry for entry in root.rglob("*") if entry.is_file()]


def test_every_real_file_uploads_detected_and_named_with_stats_of_the_pure_logic(
    service: Service, trajectories: Path
) -> None:
    with service.client() as client:
        for file_name, (fmt, count) in EXPECTED_FILES.items():
            detected = upload(client, trajectories / file_name, name="real")
            assert detected.status_code == 201, (file_name, detected.text)
            named = upload(client, trajectories / file_name, name="real-named", format=fmt)
            assert named.status_code == 201, (file_name, named.text)
            assert detected.json()["record_count"] == named.json()["record_count"] == count, file_name

            stats = client.get(f"/datasets/{detected.json()['id']}/stats").json()["stats"]
            expected = DatasetStats()
            for outcome in import_file(trajectories / file_name):
                assert isinstance(outcome, ImportedRecord)
                expected.add(compute_record_stats(outcome.record, ApproximateTokenCounter()))
            wanted = expected.as_dict()
            for key in ("records", "completion_rate", "tool_stats", "tool_calls", "api_calls", "tokens", "turns"):
                assert stats[key] == wanted[key], (file_name, key)
            assert stats["source_formats"] == {fmt: count}
            assert stats["token_counter"] == "approx-regex-v1"
            reasoning = stats["reasoning_stats"]
            assert reasoning["coverage"] == reasoning["records_with_reasoning"] / count
        listed = client.get("/datasets", params={"name": "real", "limit": 200}).json()
        assert listed["count"] == len(EXPECTED_FILES)
        paged, cursor = [], None
        while True:
            page = client.get("/datasets", params={"limit": 7, **({"cursor": cursor} if cursor else {})}).json()
            paged.extend(page["datasets"])
            if (cursor := page["next_cursor"]) is None:
                break
        assert len(paged) == 2 * len(EXPECTED_FILES) == len({d["id"] for d in paged})


def test_tool_failure_rates_follow_the_spec_rule_on_tau_bench(service: Service, trajectories: Path) -> None:
    with service.client() as client:
        dataset = upload(client, trajectories / TAU).json()
        tools = client.get(f"/datasets/{dataset['id']}/stats").json()["stats"]["tool_stats"]
    # tau-bench answers a refused booking with "Error: ..." — a failure; a lookup mentioning "error" is not.
    booking = tools["book_reservation"]
    assert booking["failure"] > 0 and booking["success"] + booking["failure"] == booking["count"]
    assert booking["failure_rate"] == booking["failure"] / booking["count"]
    assert tools["calculate"]["failure"] == 0


def test_pages_and_exports_round_trip(service: Service, trajectories: Path) -> None:
    with service.client() as client:
        dataset = upload(client, trajectories / TAU).json()
        pages, offset = [], 0
        while offset is not None:
            page = client.get(f"/datasets/{dataset['id']}/records", params={"offset": offset, "limit": 4}).json()
            assert page["total"] == 11
            pages.extend(page["records"])
            offset = page["next_offset"]
        assert len(pages) == 11
        assert {"task_id", "reward", "trial"} <= pages[0]["metadata"].keys()  # other keys kept as metadata
        exported = client.get(f"/datasets/{dataset['id']}/export")
        assert exported.headers["content-type"].startswith("application/x-ndjson")
        lines = exported.text.splitlines()
        assert [json.loads(line) for line in lines] == pages

        again = client.post("/datasets", params={"name": "again"}, content=exported.content).json()
        assert again["record_count"] == 11
        assert client.get(f"/datasets/{again['id']}/export").content == exported.content

        sharegpt = client.get(f"/datasets/{dataset['id']}/export", params={"format": "sharegpt"})
        plain = [json.loads(line) for line in sharegpt.text.splitlines()]
        assert len(plain) == 11
        assert all(set(turn) == {"from", "value"} for line in plain for turn in line["conversations"])
        assert plain[5]["task_id"] == pages[5]["metadata"]["task_id"]

        beyond = client.get(f"/datasets/{dataset['id']}/records", params={"offset": 500}).json()
        assert beyond["records"] == [] and beyond["next_offset"] is None


def test_multipart_and_single_line_json_documents(service: Service, trajectories: Path, tmp_path: Path) -> None:
    minified = tmp_path / "tau.json"
    records = json.loads((trajectories / TAU).read_text()) * 16  # over 2 MiB on one line
    minified.write_text(json.dumps(records), encoding="utf-8")
    assert minified.stat().st_size > 2 << 20 and minified.read_text().count("\n") == 0  # read in several chunks
    with service.client() as client:
        from_file = client.post(
            "/datasets", params={"name": "form"}, files={"file": ("x.traj", (trajectories / TAU).read_bytes())}
        )
        assert from_file.status_code == 201 and from_file.json()["record_count"] == 11
        one_line = upload(client, minified, name="minified")
        assert one_line.status_code == 201, one_line.text
        assert one_line.json()["record_count"] == len(records)
        no_file = client.post("/datasets", params={"name": "form"}, files={"other": ("x", b"{}")})
        assert no_file.status_code == 422


def test_bad_lines_are_reported_by_line_and_nothing_is_stored(service: Service) -> None:
    lines = [
        json.dumps(GOOD),
        '{"messages": [{"role": "user", "content": "cut',
        json.dumps({"messages": [{"role": "robot", "content": "beep"}]}),
        json.dumps({"messages": [{"role": "tool", "tool_call_id": "c9", "content": "orphan"}]}),
        json.dumps({**GOOD, "task_id": 7}),
    ]
    body = "\n".join(lines).encode()
    with service.client() as client:
        refused = client.post("/datasets", params={"name": "bad"}, content=body)
        assert refused.status_code == 422
        error = refused.json()["error"]
        assert error["code"] == "INVALID_RECORDS"
        reported = [(e["line"], e["code"]) for e in error["details"]["errors"]]
        assert reported == [(2, "INVALID_JSON"), (3, "UNKNOWN_ROLE"), (4, "TOOL_RESULT_WITHOUT_CALL")]
        assert error["details"]["errors"][1]["path"] == "messages[0].role"
        assert client.get("/datasets").json()["count"] == 0
        assert stored_dataset_dirs(service.settings) == []

        skipped = client.post("/datasets", params={"name": "bad", "on_error": "skip"}, content=body)
        assert skipped.status_code == 201
        report = skipped.json()["report"]
        assert skipped.json()["record_count"] == 2 and report["skipped"] == 3
        assert [e["line"] for e in report["errors"]] == [2, 3, 4]
        records = client.get(f"/datasets/{skipped.json()['id']}/records").json()["records"]
        assert [r["metadata"] for r in records] == [{"answer": "4"}, {"answer": "4", "task_id": 7}]

        not_utf8 = client.post("/datasets", params={"name": "x"}, content=json.dumps(GOOD).encode() + b"\n\xff\xfe\n")
        assert not_utf8.status_code == 422 and not_utf8.json()["error"]["code"] == "INVALID_ENCODING"
        assert not_utf8.json()["error"]["details"]["line"] == 2
        empty = client.post("/datasets", params={"name": "x"}, content=b"\n\n")
        assert empty.status_code == 422 and empty.json()["error"]["code"] == "EMPTY_UPLOAD"
        unknown_format = client.post("/datasets", params={"name": "x", "format": "sharegpt"}, content=body[:100])
        assert unknown_format.status_code == 422
        unknown_tokenizer = client.post("/datasets", params={"name": "x", "tokenizer": "nope"}, content=body)
        assert unknown_tokenizer.status_code == 404
        assert unknown_tokenizer.json()["error"]["code"] == "TOKENIZER_NOT_FOUND"
        assert client.get("/datasets").json()["count"] == 1


def test_path_like_names_and_ids_are_refused(service: Service) -> None:
    with service.client() as client:
        for name in ("../escape", "a/b", ".hidden", "x" * 200):
            response = client.post("/datasets", params={"name": name}, content=json.dumps(GOOD).encode())
            assert response.status_code == 422, name
        for dataset_id in ("..", ".staging", "..%2F..%2Fetc", "a%00b"):
            for suffix in ("", "/records", "/stats", "/export"):
                response = client.get(f"/datasets/{dataset_id}{suffix}")
                assert response.status_code in (404, 422), (dataset_id, suffix, response.status_code)
        assert client.get("/datasets/dsnothere/exports/..").status_code in (404, 422)
        assert client.delete("/datasets/..").status_code in (404, 405, 422)
    assert stored_dataset_dirs(service.settings) == []


def test_upload_limit_is_separate_from_the_json_limit(
    make_settings: Callable[..., Settings], trajectories: Path, tmp_path: Path
) -> None:
    settings = make_settings(max_body_bytes=64 << 10, dataset_upload_max_bytes=2 << 20)
    large = trajectories / "nemo-gym-conversational-tool-use-rollouts.jsonl"  # 125 KB: over the JSON limit
    oversized = tmp_path / "oversized.jsonl"  # the same records, repeated past the upload limit
    oversized.write_bytes(large.read_bytes() * 20)
    assert (64 << 10) < large.stat().st_size < (2 << 20) < oversized.stat().st_size
    with in_process_service(settings) as live, live.client() as client:
        accepted = upload(client, large)
        assert accepted.status_code == 201, accepted.text
        too_large = upload(client, oversized)
        assert too_large.status_code == 413 and too_large.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"

        def chunked() -> Iterator[bytes]:  # no Content-Length: the limit counts what arrives
            data = oversized.read_bytes()
            for start in range(0, len(data), 1 << 16):
                yield data[start : start + (1 << 16)]

        streamed = client.post("/datasets", params={"name": "chunked"}, content=chunked())
        assert streamed.status_code == 413
        json_body = client.post(f"/datasets/{accepted.json()['id']}/filter", json={"allowed_tools": ["x" * 100] * 900})
        assert json_body.status_code == 413
        assert client.get("/datasets").json()["count"] == 1
        uploads = settings.data_path / "datasets" / ".uploads"
        assert not uploads.exists() or list(uploads.iterdir()) == []  # refused bodies leave no spool file


def test_delete_keeps_lineage_of_children(service: Service, trajectories: Path) -> None:
    with service.client() as client:
        parent = upload(client, trajectories / "nemo-gym-xlam-fc-rollouts.jsonl").json()
        job = client.post(f"/datasets/{parent['id']}/filter", json={"drop_incomplete": True}).json()
        child_id = wait_job(client, job)["result"]["dataset_id"]
        assert client.delete(f"/datasets/{parent['id']}").status_code == 204
        assert client.get(f"/datasets/{parent['id']}").status_code == 404
        assert client.delete(f"/datasets/{parent['id']}").status_code == 404
        child = client.get(f"/datasets/{child_id}").json()
        assert child["parent_id"] == parent["id"] and child["operation"] == "filter"
        assert not (service.settings.data_path / "datasets" / parent["id"]).exists()


def test_a_batch_runner_record_uploads_with_stats_recomputed_from_its_turns(service: Service) -> None:
    wrong_stats = {**BATCH_RUNNER_RECORD, "tool_stats": {"terminal": {"count": 9, "success": 0, "failure": 9}}}
    with service.client() as client:
        created = client.post("/datasets", params={"name": "batch"}, content=json.dumps(wrong_stats).encode())
        assert created.status_code == 201, created.text
        stats = client.get(f"/datasets/{created.json()['id']}/stats").json()["stats"]
        assert stats["source_formats"] == {"batch_runner": 1} and stats["completion_rate"] == 1.0
        assert stats["tool_stats"]["terminal"] == {**stats["tool_stats"]["terminal"], "count": 1, "success": 1}
        [stored] = client.get(f"/datasets/{created.json()['id']}/records").json()["records"]
        assert stored["metadata"]["toolsets_used"] == ["terminal"]
        # Each stored and exported line carries its own statistics, from its turns.
        assert stored["tool_stats"]["terminal"]["count"] == 1 and stored["api_calls"] == 2
        assert stored["reasoning_stats"]["turns_with_reasoning"] == 1
        exported = client.get(f"/datasets/{created.json()['id']}/export")
        plain = json.loads(client.get(f"/datasets/{created.json()['id']}/export", params={"format": "sharegpt"}).text)
        for line in (json.loads(exported.text), plain):
            assert {k: line[k] for k in ("tool_stats", "reasoning_stats", "api_calls")} == {
                k: stored[k] for k in ("tool_stats", "reasoning_stats", "api_calls")
            }
        again = client.post("/datasets", params={"name": "again"}, content=exported.content).json()
        assert client.get(f"/datasets/{again['id']}/export").content == exported.content
