"""The client commands of `rlctl`: envs, runs, jobs, datasets, inference-test.

Each talks to a running service over HTTP (`--url` / RLCTL_URL, `--token` / RLCTL_API_TOKEN), prints tables
for people or, with `--json`, the API's JSON for scripts. Following a run or a job shows a live progress line
on stderr and prints the final record on stdout. Exit codes: 0 done, 1 an error answer or a failed run/job,
2 bad usage, 3 service unreachable, 75 rate limited (try again later).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

from rlctl.service.client import output
from rlctl.service.client.api import DEFAULT_URL, ApiClient, ClientError, RateLimitedError
from rlctl.service.collections.schemas import ENDED as COLLECTION_ENDED
from rlctl.service.states import JOB_TERMINAL, RUN_TERMINAL, JobStatus, RunStatus

PROCESSES = ("api", "trainer", "env")
EXPORT_FORMATS = ("rlctl", "sharegpt", "grpo")
UPLOAD_CHUNK = 1 << 20
Handler = Callable[[ApiClient, argparse.Namespace], int]


# --- wiring into the `rlctl` parser ---


def add_client_commands(parser: argparse.ArgumentParser, commands: Any) -> None:
    """Adds the client commands; connection options work before or after the command name."""
    _connection_options(parser, suppress=False)
    common = argparse.ArgumentParser(add_help=False)
    _connection_options(common, suppress=True)

    def group(name: str, help_text: str) -> Any:
        return commands.add_parser(name, help=help_text).add_subparsers(title=f"{name} commands", metavar="COMMAND")

    def command(subcommands: Any, name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = subcommands.add_parser(
            name, help=help_text, parents=[common], description=help_text
        )
        sub.set_defaults(handler=_client_command(handler))
        return sub

    envs = group("envs", "environments you can train on")
    command(envs, "list", envs_list, "list the environments")
    show = command(envs, "show", envs_show, "an environment's configurable and locked fields")
    show.add_argument("name")
    show.add_argument("--backend", choices=("local", "tinker"), help="whose locked values to show")

    runs = group("runs", "training runs")
    start = command(runs, "start", runs_start, "start a run")
    start.add_argument("environment", nargs="?", help="the environment to train on (or --dataset)")
    start.add_argument("--dataset", metavar="ID", help="train on this trajectory dataset instead of an environment")
    start.add_argument("--mode", choices=("offline", "online", "sft"), default="offline", help="how to use the dataset")
    start.add_argument("--top-n", type=int, metavar="N", help="sft: completions trained per group, best first")
    start.add_argument(
        "--mix",
        action="append",
        default=[],
        metavar="NAME[=WEIGHT]",
        help="an environment of a mixed run, instead of ENVIRONMENT (repeat for each)",
    )
    start.add_argument("--held-out", type=float, default=0.0, metavar="SHARE", help="share of prompts kept out")
    start.add_argument(
        "--reward",
        dest="rewards",
        action="append",
        default=[],
        metavar="NAME[=WEIGHT]",
        help="online: a reward of the policy's completions (repeat to combine)",
    )
    start.add_argument("--backend", choices=("local", "tinker"), help="default: the server's")
    start.add_argument("--set", dest="edits", action="append", default=[], metavar="FIELD=VALUE", help="config edit")
    start.add_argument("--config", type=Path, metavar="FILE", help="YAML or JSON mapping of config edits")
    start.add_argument("--cpus", type=float, help="CPU cores the run asks for (default: its backend's)")
    start.add_argument("--gpus", type=int, help="GPUs the run asks for (default: its backend's)")
    start.add_argument("--memory-gb", type=float, help="memory in GB the run asks for (default: its backend's)")
    start.add_argument("--priority", type=int, help="queue order when it must wait: higher starts first")
    start.add_argument("--idempotency-key", help="a retry with the same key returns the same run")
    start.add_argument(
        "--init-from", metavar="RUN[:STEP]", help="warm start from another run's checkpoint (default: its newest)"
    )
    _follow_options(start, "until the run ends, with live progress")
    lister = command(runs, "list", runs_list, "list runs, newest first")
    lister.add_argument("--status", choices=list(RunStatus))
    lister.add_argument("--environment")
    lister.add_argument("--limit", type=int, default=50)
    lister.add_argument("--cursor", help="next_cursor of the previous page")
    show = command(runs, "show", runs_show, "a run's stored record")
    show.add_argument("run_id")
    _follow_options(show, "until the run ends, with live progress")
    status = command(runs, "status", runs_status, "check a run live (rate limited by the server)")
    status.add_argument("run_id")
    stop = command(runs, "stop", runs_stop, "stop a run")
    stop.add_argument("run_id")
    stop.add_argument("--wait", type=float, default=0, metavar="SECONDS", help="wait this long for it to end")
    resume = command(runs, "resume", runs_resume, "resume a stopped or failed run from its checkpoint")
    resume.add_argument("run_id")
    resume.add_argument("--step", type=int, help="the checkpoint's step (default: the newest)")
    _follow_options(resume, "until the run ends, with live progress")
    results = command(runs, "results", runs_results, "a run's final metrics, checkpoints and weights")
    results.add_argument("run_id")
    logs = command(runs, "logs", runs_logs, "a run process's log")
    logs.add_argument("run_id")
    logs.add_argument("process", nargs="?", default="trainer", choices=PROCESSES)
    logs.add_argument("--tail", type=int, default=200, help="last lines to show first")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until the run ends")

    jobs = group("jobs", "background jobs")
    lister = command(jobs, "list", jobs_list, "list jobs, newest first")
    lister.add_argument("--kind")
    lister.add_argument("--status", choices=list(JobStatus))
    lister.add_argument("--limit", type=int, default=50)
    show = command(jobs, "show", jobs_show, "a job's state, progress and result")
    show.add_argument("job_id")
    _follow_options(show, "until the job ends, with live progress")
    cancel = command(jobs, "cancel", jobs_cancel, "cancel a job")
    cancel.add_argument("job_id")

    datasets = group("datasets", "trajectory datasets")
    upload = command(datasets, "upload", datasets_upload, "upload a JSONL file as a new dataset")
    upload.add_argument("file", type=Path)
    upload.add_argument("--name", required=True)
    upload.add_argument("--format", help="the records' format; detected by the server when absent")
    lister = command(datasets, "list", datasets_list, "list datasets")
    lister.add_argument("--limit", type=int, default=50)
    for name, handler in (("compress", datasets_compress), ("score", datasets_score)):
        operation = command(datasets, name, handler, f"{name} a dataset into a new one (a background job)")
        operation.add_argument("dataset_id")
        operation.add_argument("--set", dest="params", action="append", default=[], metavar="PARAM=VALUE")
        operation.add_argument("--no-wait", dest="wait", action="store_false", help="print the job and return")
        operation.add_argument("--interval", type=float, default=1.0, help=argparse.SUPPRESS)
        if name == "score":
            operation.add_argument(
                "--reward", dest="rewards", action="append", default=[], metavar="NAME[=WEIGHT]", help="repeatable"
            )
    export = command(datasets, "export", datasets_export, "download a dataset as JSONL (or its GRPO export)")
    export.add_argument("dataset_id")
    export.add_argument("-o", "--output", type=Path, help="file to write (default: stdout)")
    export.add_argument(
        "--format",
        choices=EXPORT_FORMATS,
        help="rlctl (default), sharegpt, or grpo (prompt groups with advantages, built by a job first); "
        "an output named *.grpo.jsonl or grpo.jsonl means grpo",
    )
    export.add_argument("--set", dest="params", action="append", default=[], metavar="PARAM=VALUE", help="grpo")
    export.add_argument("--interval", type=float, default=1.0, help=argparse.SUPPRESS)

    test = commands.add_parser(
        "inference-test", help="smoke-test an environment against inference endpoints", parents=[common]
    )
    test.add_argument("environment")
    test.add_argument("--steps", dest="num_steps", type=int)
    test.add_argument("--group-size", type=int)
    test.add_argument("--model", dest="models", action="append", help="model id; repeat for several")
    test.add_argument("--base-url", help="OpenAI-compatible endpoint (default: the server's)")
    test.add_argument("--no-wait", dest="wait", action="store_false", help="print the job and return")
    test.add_argument("--interval", type=float, default=1.0, help=argparse.SUPPRESS)
    test.set_defaults(handler=_client_command(inference_test))

    collect = commands.add_parser(
        "collect", help="an agent answers prompts with tools; its trajectories become a dataset", parents=[common]
    )
    collect.add_argument("spec", type=Path, help="the collection (POST /collections' body) as a YAML or JSON file")
    agent = collect.add_mutually_exclusive_group()
    agent.add_argument("--model", help="the agent: a model id at the spec's base_url (replaces the spec's model)")
    agent.add_argument("--checkpoint", help="the agent: a run's checkpoint, RUN:STEP (RUN alone: its newest)")
    collect.add_argument("--no-wait", dest="wait", action="store_false", help="print the collection and return")
    collect.add_argument("--interval", type=float, default=1.0, help=argparse.SUPPRESS)
    collect.set_defaults(handler=_client_command(collection))

    evaluate = commands.add_parser(
        "eval", help="compare a run's checkpoints with its base model on held-out prompts", parents=[common]
    )
    evaluate.add_argument("run_id")
    evaluate.add_argument("--step", dest="steps", type=int, action="append", help="checkpoint step; repeatable")
    evaluate.add_argument("--split", choices=("held_out", "train"), help="the run's prompts to answer")
    evaluate.add_argument("--reward", dest="rewards", action="append", default=[], metavar="NAME[=WEIGHT]")
    evaluate.add_argument("--samples", dest="samples_per_prompt", type=int, help="completions per prompt and model")
    evaluate.add_argument("--max-prompts", type=int)
    evaluate.add_argument("--max-tokens", type=int)
    evaluate.add_argument("--no-wait", dest="wait", action="store_false", help="print the evaluation and return")
    evaluate.add_argument("--interval", type=float, default=1.0, help=argparse.SUPPRESS)
    evaluate.set_defaults(handler=_client_command(evaluation))


def _connection_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    default = (lambda value: argparse.SUPPRESS) if suppress else (lambda value: value)
    parser.add_argument("--url", default=default(None), help=f"service URL (RLCTL_URL, default {DEFAULT_URL})")
    parser.add_argument("--token", default=default(None), help="API token (prefer RLCTL_API_TOKEN)")
    parser.add_argument("--json", action="store_true", default=default(False), help="print JSON for scripts")
    parser.add_argument("--timeout", type=float, default=default(60.0), help="seconds per request")


def _follow_options(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("-f", "--follow", action="store_true", help=f"wait {what}")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between polls while following")


def _client_command(handler: Handler) -> Callable[[argparse.Namespace], int]:
    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        url = args.url or os.environ.get("RLCTL_URL") or DEFAULT_URL
        token = args.token or os.environ.get("RLCTL_API_TOKEN") or None
        client = ApiClient(url, token, args.timeout)
        try:
            return handler(client, args)
        except ClientError as exc:
            if args.json and exc.body is not None:
                output.print_json(exc.body)
            print(f"rlctl: {exc}", file=sys.stderr)
            return exc.exit_code
        except KeyboardInterrupt:
            return 130
        finally:
            client.close()

    return run


def _emit(args: argparse.Namespace, value: Any, human: Callable[[Any], str]) -> None:
    if args.json:
        output.print_json(value)
    else:
        print(human(value))


# --- environments ---


def envs_list(client: ApiClient, args: argparse.Namespace) -> int:
    body = client.get("/environments")
    _emit(args, body, lambda b: output.table(b["environments"], ["name", "description", "config_class", "file_path"]))
    for error in [] if args.json else body.get("errors", []):
        print(f"rlctl: {error['file_path']} could not be read: {error['error']}", file=sys.stderr)
    return 0


def envs_show(client: ApiClient, args: argparse.Namespace) -> int:
    body = client.get(f"/environments/{_segment(args.name)}", backend=args.backend)

    def human(env: dict[str, Any]) -> str:
        facts = [(k, env.get(k)) for k in ("name", "description", "class_name", "config_class", "file_path", "backend")]
        configurable = output.table(env["configurable_fields"], ["name", "type", "default", "description"])
        locked = output.table(env["locked_fields"], ["name", "value", "description"])
        return f"{output.key_values(facts)}\n\nConfigurable fields\n{configurable}\n\nLocked fields\n{locked}"

    _emit(args, body, human)
    return 0


# --- runs ---


def runs_start(client: ApiClient, args: argparse.Namespace) -> int:
    edits = _load_mapping(args.config) if args.config else {}
    edits.update(_assignments(args.edits))
    body = {
        "environment": args.environment,
        "environments": _rewards(args.mix) or None,  # the same NAME[=WEIGHT] shape as a reward
        "dataset": _dataset_source(args),
        "config": edits,
        "backend": args.backend,
        "resources": _resources(args),
        "priority": args.priority,
        "idempotency_key": args.idempotency_key,
        "init_from": _init_from(args.init_from) if args.init_from else None,
    }
    run = client.post("/runs", {k: v for k, v in body.items() if v is not None})
    if not args.follow:
        _emit(args, run, _run_text)
        return 0
    print(f"run {run['id']} started", file=sys.stderr)
    return _finish_following(args, _follow_run(client, run["id"], args.interval))


def _init_from(value: str) -> dict[str, Any]:
    """RUN or RUN:STEP."""
    run, _, step = value.partition(":")
    if step and not step.isdigit():
        raise SystemExit(f"--init-from: {step!r} is not a step number (RUN or RUN:STEP)")
    return {"run": run, "step": int(step) if step else None}


def runs_resume(client: ApiClient, args: argparse.Namespace) -> int:
    run = client.post(f"/runs/{_segment(args.run_id)}/resume", {"step": args.step})
    if not args.follow:
        _emit(args, run, _run_text)
        return 0
    print(f"run {run['id']} resumed from step {run['last_step']}", file=sys.stderr)
    return _finish_following(args, _follow_run(client, run["id"], args.interval))


def _resources(args: argparse.Namespace) -> dict[str, Any] | None:
    """The request's `resources` (the same model as POST /runs: the service validates them); None: defaults."""
    given = {"cpus": args.cpus, "gpus": args.gpus, "memory_gb": args.memory_gb}
    return {k: v for k, v in given.items() if v is not None} or None


def _dataset_source(args: argparse.Namespace) -> dict[str, Any] | None:
    """The request's `dataset` (the same model as POST /runs); the service says when both or neither are given."""
    if args.dataset is None:
        return None
    source = {"id": args.dataset, "mode": args.mode, "held_out": args.held_out, "rewards": _rewards(args.rewards)}
    return source | ({"top_n": args.top_n} if args.top_n is not None else {})


def _rewards(entries: list[str]) -> list[dict[str, Any]]:
    """`NAME[=WEIGHT]` options as reward specs."""
    rewards = []
    for entry in entries:
        name, _, weight = entry.partition("=")
        rewards.append({"name": name, "weight": float(weight) if weight else 1.0})
    return rewards


def runs_list(client: ApiClient, args: argparse.Namespace) -> int:
    body = client.get("/runs", status=args.status, environment=args.environment, limit=args.limit, cursor=args.cursor)

    def human(page: dict[str, Any]) -> str:
        rows = [{**r, "step": _step_text(r), "status": _status_word(r)} for r in page["runs"]]
        text = output.table(rows, ["id", "environment", "backend", "status", "step", "stalled", "created_at"])
        return text + (f"\nmore: --cursor {page['next_cursor']}" if page.get("next_cursor") else "")

    _emit(args, body, human)
    return 0


def runs_show(client: ApiClient, args: argparse.Namespace) -> int:
    if args.follow:
        return _finish_following(args, _follow_run(client, args.run_id, args.interval))
    _emit(args, client.get(f"/runs/{_segment(args.run_id)}"), _run_text)
    return 0


def runs_status(client: ApiClient, args: argparse.Namespace) -> int:
    try:
        status = client.get(f"/runs/{_segment(args.run_id)}/status")
    except RateLimitedError as exc:
        snapshot = (exc.body or {}).get("last_snapshot")
        if args.json:
            output.print_json(exc.body)
        elif snapshot:
            print("last check:\n" + _status_text(snapshot))
        print(f"rlctl: {exc}", file=sys.stderr)
        return exc.exit_code
    _emit(args, status, _status_text)
    return 0


def runs_stop(client: ApiClient, args: argparse.Namespace) -> int:
    _emit(args, client.post(f"/runs/{_segment(args.run_id)}/stop", wait_s=args.wait or None), _run_text)
    return 0


def runs_results(client: ApiClient, args: argparse.Namespace) -> int:
    def human(results: dict[str, Any]) -> str:
        facts = [
            ("run", results["run_id"]),
            ("status", results["status"]),
            ("final step", results["final_step"]),
            ("weights", results["weights"]),
            ("wandb", results.get("wandb_url")),
        ]
        final = [{"metric": name, "value": value} for name, value in sorted(results["final_metrics"].items())]
        checkpoints = output.table(results["checkpoints"], ["step", "path"]) if results["checkpoints"] else "(none)"
        text = f"{output.key_values(facts)}\n\nFinal metrics\n{output.table(final, ['metric', 'value'])}"
        return f"{text}\n\nCheckpoints\n{checkpoints}" + _failure_text(results.get("failure"))

    _emit(args, client.get(f"/runs/{_segment(args.run_id)}/results"), human)
    return 0


def runs_logs(client: ApiClient, args: argparse.Namespace) -> int:
    path = f"/runs/{_segment(args.run_id)}/logs/{args.process}"
    chunks = client.stream(path, tail=args.tail, follow="true" if args.follow else None)
    _copy(chunks, sys.stdout.buffer)
    return 0


def _follow_run(client: ApiClient, run_id: str, interval: float) -> dict[str, Any]:
    """Polls the stored record (never the rate-limited live check) until the run ends."""
    progress = output.Progress()
    seen_step, reward = None, None
    path = f"/runs/{_segment(run_id)}"
    while True:
        run: dict[str, Any] = client.get(path)
        if run["last_step"] is not None and run["last_step"] != seen_step:
            seen_step = run["last_step"]
            series = client.get(f"{path}/metrics", name="reward/mean", min_step=seen_step)["metrics"]
            reward = series["reward/mean"][-1][1] if series.get("reward/mean") else reward
        line = f"run {run['id']} {run['environment']}: {run['status']}  step {_step_text(run)}"
        progress.update(line + (f"  reward/mean {reward:.4g}" if reward is not None else ""))
        if run["status"] in RUN_TERMINAL:
            progress.done()
            return run
        time.sleep(interval)


def _finish_following(args: argparse.Namespace, run: dict[str, Any]) -> int:
    _emit(args, run, _run_text)
    return 1 if run["status"] == "failed" else 0


def _run_text(run: dict[str, Any]) -> str:
    facts = [
        ("run", run["id"]),
        ("environment", run["environment"]),
        ("backend", run["backend"]),
        ("status", _status_word(run) + (" (stalled)" if run.get("stalled") else "")),
        ("step", _step_text(run)),
        ("created", run["created_at"]),
        ("started", run.get("started_at")),
        ("ended", run.get("ended_at")),
        ("wandb", run.get("wandb_url") or run.get("wandb_run_name")),
        ("weights", run.get("weights")),
    ]
    processes = run.get("processes") or []
    text = output.key_values(facts)
    if processes:
        text += "\n\n" + output.table(processes, ["role", "pid", "status", "exit_code", "signal", "log_path"])
    return text + _failure_text(run.get("failure"))


def _status_word(run: dict[str, Any]) -> str:
    """A run's state, with its place in the queue while it waits there."""
    position = run.get("queue_position")
    return f"{run['status']} #{position}" if position else str(run["status"])


def _status_text(status: dict[str, Any]) -> str:
    metrics = status.get("metrics") or {}
    facts = [
        ("run", status.get("run_id")),
        ("status", status.get("status")),
        ("step", _step_text(status)),
        ("running for", f"{status.get('running_time_minutes', 0)} min"),
        ("reward/mean", metrics.get("reward_mean")),
        ("train/loss", metrics.get("loss")),
        ("percent correct", metrics.get("percent_correct")),
        ("checked at", status.get("checked_at")),
    ]
    processes = output.table(status.get("processes") or [], ["role", "pid", "status", "exit_code", "signal"])
    return f"{output.key_values(facts)}\n\n{processes}" + _failure_text(status.get("failure"))


def _failure_text(failure: dict[str, Any] | None) -> str:
    if not failure:
        return ""
    tail = "\n".join(f"  {line}" for line in failure.get("log_tail") or [])
    return f"\n\nfailure: {failure.get('kind')}: {failure.get('message')}" + (f"\n{tail}" if tail else "")


def _step_text(run: dict[str, Any]) -> str:
    step, total = run.get("last_step"), run.get("total_steps")
    return f"{'-' if step is None else step}/{'-' if total is None else total}"


# --- jobs ---


def jobs_list(client: ApiClient, args: argparse.Namespace) -> int:
    body = client.get("/jobs", kind=args.kind, status=args.status, limit=args.limit)
    rows = [{**job, "progress": output.bar(**job["progress"], width=10)} for job in body["jobs"]]
    _emit(args, body, lambda _: output.table(rows, ["id", "kind", "status", "progress", "created_at", "error"]))
    return 0


def jobs_show(client: ApiClient, args: argparse.Namespace) -> int:
    if args.follow:
        return _finish_job(args, _follow_job(client, args.job_id, args.interval))
    _emit(args, client.get(f"/jobs/{_segment(args.job_id)}"), _job_text)
    return 0


def jobs_cancel(client: ApiClient, args: argparse.Namespace) -> int:
    _emit(args, client.post(f"/jobs/{_segment(args.job_id)}/cancel"), _job_text)
    return 0


def _follow_job(client: ApiClient, job_id: str, interval: float) -> dict[str, Any]:
    progress = output.Progress()
    while True:
        job: dict[str, Any] = client.get(f"/jobs/{_segment(job_id)}")
        progress.update(f"job {job['id']} {job.get('kind', '')}: {job['status']} {output.bar(**job['progress'])}")
        if job["status"] in JOB_TERMINAL:
            progress.done()
            return job
        time.sleep(interval)


def _finish_job(args: argparse.Namespace, job: dict[str, Any]) -> int:
    _emit(args, job, _job_text)
    if job["status"] != "succeeded":
        print(f"rlctl: job {job['id']} {job['status']}: {job.get('error') or 'no reason given'}", file=sys.stderr)
        return 1
    return 0


def _job_text(job: dict[str, Any]) -> str:
    progress = job.get("progress") or {"done": 0, "total": None}
    facts = [
        ("job", job["id"]),
        ("kind", job.get("kind")),
        ("status", job["status"]),
        ("progress", output.bar(**progress)),
        ("error", job.get("error")),
    ]
    result = job.get("result")
    result_text = "\n\nresult\n" + json.dumps(result, indent=2, sort_keys=True, default=str) if result else ""
    return output.key_values(facts) + result_text


def _start_job(client: ApiClient, args: argparse.Namespace, path: str, body: dict[str, Any]) -> int:
    """POST an operation answered 202 with a job; then follow it (unless --no-wait)."""
    job = client.post(path, body)
    if not args.wait:
        _emit(args, job, _job_text)
        return 0
    return _finish_job(args, _follow_job(client, job["id"], args.interval))


# --- datasets (routes documented in the API; thin on purpose) ---


def datasets_upload(client: ApiClient, args: argparse.Namespace) -> int:
    size = args.file.stat().st_size
    dataset = client.upload(
        "/datasets", _file_chunks(args.file), size, "application/x-ndjson", name=args.name, format=args.format
    )
    _emit(args, dataset, _record_text)
    return 0


def datasets_list(client: ApiClient, args: argparse.Namespace) -> int:
    body = client.get("/datasets", limit=args.limit)
    items = body if isinstance(body, list) else body.get("datasets", [])
    preferred = ["id", "name", "format", "record_count", "records", "parent_id", "operation", "created_at"]
    _emit(args, body, lambda _: output.generic_table(items, preferred))
    return 0


def datasets_compress(client: ApiClient, args: argparse.Namespace) -> int:
    return _start_job(client, args, f"/datasets/{_segment(args.dataset_id)}/compress", _assignments(args.params))


def datasets_score(client: ApiClient, args: argparse.Namespace) -> int:
    body = _assignments(args.params)
    if args.rewards:
        body["rewards"] = _rewards(args.rewards)
    return _start_job(client, args, f"/datasets/{_segment(args.dataset_id)}/score", body)


def export_format(args: argparse.Namespace) -> str:
    """--format, else `grpo` for an output file named *.grpo.jsonl (or grpo.jsonl), else `rlctl`."""
    if args.format:
        return str(args.format)
    name = args.output.name if args.output is not None else ""
    return "grpo" if name == "grpo.jsonl" or name.endswith(".grpo.jsonl") else "rlctl"


def datasets_export(client: ApiClient, args: argparse.Namespace) -> int:
    dataset = _segment(args.dataset_id)
    fmt = export_format(args)
    if fmt == "grpo":
        job = _follow_job(
            client, client.post(f"/datasets/{dataset}/export-grpo", _assignments(args.params))["id"], args.interval
        )
        if job["status"] != "succeeded":
            return _finish_job(args, job)
        chunks = client.stream(job["result"]["download"])
    else:
        chunks = client.stream(f"/datasets/{dataset}/export", format=fmt)
    if args.output is None:
        _copy(chunks, sys.stdout.buffer)
        return 0
    partial = args.output.with_name(args.output.name + ".partial")
    with partial.open("wb") as handle:
        _copy(chunks, handle)
    partial.replace(args.output)  # an interrupted export never looks complete
    print(f"wrote {args.output} ({args.output.stat().st_size} bytes, {fmt})", file=sys.stderr)
    return 0


# --- inference tests ---


def inference_test(client: ApiClient, args: argparse.Namespace) -> int:
    body = {
        "environment": args.environment,
        "num_steps": args.num_steps,
        "group_size": args.group_size,
        "models": args.models,
        "base_url": args.base_url,
    }
    return _start_job(client, args, "/inference-tests", {k: v for k, v in body.items() if v is not None})


def collection(client: ApiClient, args: argparse.Namespace) -> int:
    """POST /collections, then follow it to its dataset; a run's checkpoint is named RUN:STEP, as `runs start
    --init-from` names one."""
    body = _load_mapping(args.spec)
    if args.model:
        body["model"] = args.model
    if args.checkpoint:
        body["model"] = {key: value for key, value in _init_from(args.checkpoint).items() if value is not None}
    started = client.post("/collections", body)
    current = _followed(client, args, "collection", started, COLLECTION_ENDED, _collection_progress)
    _emit(args, current, _collection_text)
    return 0 if not args.wait or current["status"] == "completed" else 1


def _collection_progress(found: dict[str, Any]) -> str:
    counts = found["progress"]
    return f"{counts['kept']} kept, {counts['discarded']} discarded, {counts['failed']} failed of {counts['total']}"


def _collection_text(found: dict[str, Any]) -> str:
    lines = [f"collection {found['id']} ({found['name']}): {found['status']}", f"model: {found['model']}"]
    lines.append(f"items: {_collection_progress(found)}")
    if found.get("dataset_id"):
        lines.append(f"dataset: {found['dataset_id']}")
    if found.get("error"):
        lines.append(f"error: {found['error']}")
    return "\n".join(lines)


def evaluation(client: ApiClient, args: argparse.Namespace) -> int:
    """POST /evaluations, then follow it; the table is each model's mean, difference, interval and win rate."""
    body = {
        "run_id": args.run_id,
        "steps": args.steps,
        "split": args.split,
        "rewards": _rewards(args.rewards) or None,
        "samples_per_prompt": args.samples_per_prompt,
        "max_prompts": args.max_prompts,
        "max_tokens": args.max_tokens,
    }
    started = client.post("/evaluations", {k: v for k, v in body.items() if v is not None})
    current = _followed(client, args, "evaluation", started, JOB_TERMINAL, lambda e: output.bar(**e["progress"]))
    columns = ["name", "mean_reward", "difference", "interval", "win_rate", "samples", "unscored_prompts"]
    _emit(args, current, lambda e: output.generic_table(e.get("models") or [], columns) or _record_text(e))
    if args.wait and current["status"] != "succeeded":
        print(f"rlctl: evaluation {current['id']} {current['status']}: {current.get('error')}", file=sys.stderr)
        return 1
    return 0


# --- helpers ---


def _followed(
    client: ApiClient,
    args: argparse.Namespace,
    kind: str,
    started: dict[str, Any],
    terminal: frozenset[str],
    progress_of: Callable[[dict[str, Any]], str],
) -> dict[str, Any]:
    """`started` (a `/{kind}s` resource) polled until its status is terminal, with a progress line; as it is
    with --no-wait."""
    current = started
    progress = output.Progress()
    while args.wait and current["status"] not in terminal:
        time.sleep(args.interval)
        current = client.get(f"/{kind}s/{_segment(started['id'])}")
        progress.update(f"{kind} {current['id']}: {current['status']} {progress_of(current)}")
    progress.done()
    return current


def _record_text(record: Any) -> str:
    if not isinstance(record, dict):
        return str(record)
    return output.key_values(list(record.items()))


def _assignments(items: list[str]) -> dict[str, Any]:
    """`field=value` pairs; values are JSON when they parse as JSON (8, 0.5, true, [1, 2]), else strings."""
    values: dict[str, Any] = {}
    for item in items:
        name, separator, raw = item.partition("=")
        if not separator or not name:
            raise ClientError(f"expected FIELD=VALUE, got {item!r}")
        try:
            values[name] = json.loads(raw)
        except ValueError:
            values[name] = raw
    return values


def _load_mapping(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ClientError(f"cannot read {path}: {exc}") from exc
    if not isinstance(loaded, dict):
        raise ClientError(f"{path} must hold a mapping of field: value")
    return loaded


def _segment(value: str) -> str:
    """An id as one URL path segment: the server validates it; the client only keeps it from changing the path."""
    if value in ("", ".", ".."):
        raise ClientError(f"invalid id {value!r}")
    return quote(value, safe="")


def _file_chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while chunk := handle.read(UPLOAD_CHUNK):
            yield chunk


def _copy(chunks: Iterator[bytes], sink: Any) -> None:
    for chunk in chunks:
        sink.write(chunk)
        sink.flush()
