"""The collection job: runs every (prompt index, run index) pair not yet done, `concurrency` at a time, records
each outcome as it ends, and builds the dataset when none is left.

Durability: a kept trajectory is written to `collections/{id}/items/{p}-{r}.json` (atomically) before its row
says `kept`; a discarded one only gets its row. A resume (after a cancel, or a service restart, which resumes the
job on its own) runs exactly the pairs without a kept or discarded row: duplicate prompts are distinct pairs, a
discarded pair is never run again, and a pair interrupted mid-way is run again from its start.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx2  # the HTTP library of the openai SDK (its fork of httpx)
import openai
from sqlalchemy import select

from rlctl.sandbox.bubblewrap import Sandbox, find_sandbox
from rlctl.sandbox.quotas import CollectionQuota, collection_cpus, item_slots, memory_budget
from rlctl.sandbox.toolbox import Toolbox
from rlctl.sandbox.workdir import remove_tree
from rlctl.service.collections import service
from rlctl.service.collections.agent import (
    MAX_RESPONSE_BYTES,
    AgentSettings,
    BadResponse,
    Interrupted,
    Trajectory,
    run_agent,
)
from rlctl.service.collections.schemas import CollectionStatus
from rlctl.service.collections.service import DISCARDED, DONE_STATUSES, FAILED, KEPT, collection_dir, mark
from rlctl.service.context import AppContext
from rlctl.service.datasets.builder import DatasetBuilder
from rlctl.service.datasets.service import dataset_store, get_dataset
from rlctl.service.datasets.store import write_json_atomically
from rlctl.service.datasets.tokenizers import load_counter, resolve_tokenizer
from rlctl.service.db.models import Collection, CollectionItem, Job
from rlctl.service.db.types import utcnow
from rlctl.service.errors import NotFound, ServiceError
from rlctl.service.jobs.runner import JobCancelled, JobFailed, JobHandle, JobKind
from rlctl.service.observability import scrub_json
from rlctl.service.runs.checkpoints import serve_checkpoint
from rlctl.supervisor.run import read_tail
from rlctl.trajectories.convert import ConversionError
from rlctl.trajectories.formats.chat import import_openai
from rlctl.trajectories.records import TrajectoryRecord, record_from_dict, record_to_dict
from rlctl.trajectories.stats import reasoning_stats

logger = logging.getLogger("rlctl.collections")
WAIT_SLICE_S = 0.25
CONNECTION_ERRORS = (openai.APIConnectionError, openai.APITimeoutError)


def job_kinds() -> tuple[JobKind, ...]:
    return (JobKind(service.JOB_KIND, run_collection, resumable=True),)


def run_collection(ctx: AppContext, handle: JobHandle) -> dict[str, Any]:
    collection_id = handle.params["collection_id"]
    with ctx.db.session() as session:
        collection = session.get(Collection, collection_id)
        if collection is None:
            raise JobFailed(f"collection {collection_id} no longer exists")
        params, name = dict(collection.params), collection.name
        collection.status, collection.job_id = CollectionStatus.RUNNING, handle.job_id
    try:
        with _endpoint(ctx, handle, collection_id, params) as base_url:
            result = CollectionRun(ctx, handle, collection_id, {**params, "base_url": base_url}).execute(name)
    except JobCancelled:
        if _cancel_requested(ctx, handle.job_id):
            mark(ctx, collection_id, status=CollectionStatus.CANCELLED)
        raise  # stopped by a service shutdown instead: the job resumes at the next start
    except JobFailed as error:
        mark(ctx, collection_id, status=CollectionStatus.FAILED, error=ctx.scrub(str(error)))
        raise
    except Exception as error:
        mark(ctx, collection_id, status=CollectionStatus.FAILED, error=ctx.scrub(f"{type(error).__name__}: {error}"))
        raise
    mark(ctx, collection_id, status=CollectionStatus.COMPLETED, dataset_id=result["dataset_id"], error=None)
    remove_tree(collection_dir(ctx, collection_id) / "items")
    return result


@contextmanager
def _endpoint(ctx: AppContext, handle: JobHandle, collection_id: str, params: dict[str, Any]) -> Iterator[str]:
    """The chat endpoint of the collection: its `base_url`, or its checkpoint served for the job's length (a
    resumed job serves it again)."""
    checkpoint = params.get("checkpoint")
    if checkpoint is None:
        yield params["base_url"]
        return
    log_path = collection_dir(ctx, collection_id) / "model-server.log"
    with ExitStack() as stack:  # stops the server however the collection ends
        try:
            base_url = stack.enter_context(
                serve_checkpoint(ctx, checkpoint["run_id"], checkpoint["step"], log_path, handle.check_cancelled)
            )
        except (RuntimeError, ServiceError) as error:  # not served: the job fails saying why, with the server's log
            tail = "\n".join(read_tail(log_path, 10))
            raise JobFailed(f"the checkpoint could not be served: {error}\n{tail}".strip()) from error
        yield base_url


def _nothing_collected(counts: Mapping[str, int], first_reason: Mapping[str, str | None]) -> str:
    """Why a collection that kept no trajectory fails (an empty dataset would look like a success)."""
    parts = []
    if counts[FAILED]:
        parts.append(f"{counts[FAILED]} failed (first error: {first_reason[FAILED]})")
    if counts[DISCARDED]:
        hint = (
            ": the model gave no reasoning; collect with a reasoning model or discard_without_reasoning=false"
            if first_reason[DISCARDED] == "no_reasoning"
            else f" (first reason: {first_reason[DISCARDED]})"
        )
        parts.append(f"{counts[DISCARDED]} discarded{hint}")
    return "no trajectory was collected: " + ("; ".join(parts) or "no item ran")


class CollectionRun:
    def __init__(self, ctx: AppContext, handle: JobHandle, collection_id: str, params: dict[str, Any]) -> None:
        self.ctx, self.handle, self.id, self.params = ctx, handle, collection_id, params
        self.directory = collection_dir(ctx, collection_id)
        self.prompts = _read_prompts(self.directory / "prompts.jsonl")
        self.total = len(self.prompts) * params["runs_per_prompt"]
        self.agent = AgentSettings(
            model=params["model"],
            max_turns=params["max_turns"],
            max_tokens=params["max_tokens"],
            temperature=params["temperature"],
        )
        self.client = openai.OpenAI(
            base_url=params["base_url"],
            api_key=service.chat_api_key(ctx, params["base_url"]),
            max_retries=2,
            timeout=openai.Timeout(params["request_timeout_s"], connect=min(10.0, params["request_timeout_s"])),
            http_client=httpx2.Client(transport=LimitedTransport(MAX_RESPONSE_BYTES)),
        )
        self._lock = threading.Lock()
        self._done = 0
        self._consecutive_connection_failures = 0
        self._unreachable: str | None = None  # why the job stops early (the endpoint, or the size limit)
        self._kept_bytes = sum(p.stat().st_size for p in (self.directory / "items").glob("*.json"))
        self.sandbox: Sandbox | None = None
        if "terminal" in params["tools"]:  # checked at creation; a service moved since then gets None: refusals
            found = find_sandbox(ctx.settings.sandbox_bwrap, ctx.settings.sandbox_uid)
            self.sandbox = found if isinstance(found, Sandbox) else None
        # The server's allowed ranges as they are now: a resumed collection follows today's rule.
        self.network = service.network_policy(ctx, params.get("network") or [])
        # Host-wide: items with a sandbox running at once, whatever the collections (docs/SECURITY.md#quotas).
        self.slots = item_slots(ctx.settings.sandbox_max_items)
        self.quota: CollectionQuota | None = None

    def execute(self, name: str) -> dict[str, Any]:
        if (finished := self._finished_output()) is not None:
            return finished
        done = self._done_pairs()
        pending = [
            (prompt, run)
            for prompt in range(len(self.prompts))
            for run in range(self.params["runs_per_prompt"])
            if (prompt, run) not in done
        ]
        self._done = len(done)
        self.handle.progress(self._done, self.total, force=True)
        try:
            self.quota = self._open_quota()
            self._run_all(pending)
        finally:
            if self.quota is not None:
                self.quota.close()
                self.quota = None
        self.handle.progress(self._done, self.total, force=True)
        self.handle.check_cancelled()
        if self._unreachable is not None:
            raise JobFailed(self._unreachable)
        return self._build_dataset(name)

    # --- running the pairs ---

    def _open_quota(self) -> CollectionQuota | None:
        """The collection's cgroups: its memory under the service's budget, and its CPU quota."""
        if self.sandbox is None:
            return None
        settings = self.ctx.settings
        quota = CollectionQuota(
            self.sandbox.cgroup,
            memory_budget(settings.sandbox_memory_budget_bytes),
            self.sandbox.limits.memory_bytes,
            collection_cpus(settings.sandbox_collection_cpus),
        )
        if quota.missing:
            logger.warning(
                "collection %s runs without: %s (docs/SECURITY.md#quotas)", self.id, "; ".join(quota.missing)
            )
        return quota

    def _run_all(self, pending: list[tuple[int, int]]) -> None:
        concurrency = self.params["concurrency"]
        queue = iter(pending)
        running: set[Future[None]] = set()
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix=f"collect-{self.id}") as pool:
            while True:
                while len(running) < concurrency and not self._stopping():
                    pair = next(queue, None)
                    if pair is None:
                        break
                    running.add(pool.submit(self._run_pair, *pair))
                if not running:
                    return
                finished, running = wait(running, timeout=WAIT_SLICE_S, return_when=FIRST_COMPLETED)
                for future in finished:
                    future.result()  # an unexpected error in the runner itself ends the job
                self.handle.progress(self._done, self.total)

    def _stopping(self) -> bool:
        return self.handle.cancelled or self._unreachable is not None

    def _run_pair(self, prompt_index: int, run_index: int) -> None:
        if self._stopping():
            return
        if self.sandbox is None:
            self._run_item(prompt_index, run_index)
            return
        if not self.slots.acquire(should_stop=self._stopping):
            return  # stopped while waiting for a slot: left pending
        try:
            self._run_item(prompt_index, run_index)
        finally:
            self.slots.release()

    def _run_item(self, prompt_index: int, run_index: int) -> None:
        workdir = self.directory / "sandboxes" / f"{prompt_index}-{run_index}"
        remove_tree(workdir)  # what an interrupted run left (never raises, however deep)
        workdir.mkdir(parents=True)
        toolbox = Toolbox(
            self.params["tools"],
            workdir,
            self.params["tool_timeout_s"],
            self.params["tool_output_limit"],
            self.sandbox,
            self.network,
            self.quota.item() if self.quota is not None else None,
        )
        try:
            trajectory = run_agent(
                self.client, self.agent, self._opening(prompt_index), toolbox, should_stop=self._stopping
            )
        except Interrupted:
            return  # left pending: a resume runs it again from the start
        except CONNECTION_ERRORS as error:
            self._record_failure(prompt_index, run_index, error, connection=True)
            return
        except (openai.OpenAIError, BadResponse) as error:
            self._record_failure(prompt_index, run_index, error)
            return
        finally:
            toolbox.close()
            remove_tree(workdir)
        with self._lock:
            self._consecutive_connection_failures = 0
        self._record_trajectory(prompt_index, run_index, trajectory, toolbox)

    def _opening(self, prompt_index: int) -> list[dict[str, Any]]:
        messages = []
        if self.params.get("system_prompt"):
            messages.append({"role": "system", "content": self.params["system_prompt"]})
        messages.append({"role": "user", "content": self.prompts[prompt_index]["prompt"]})
        return messages

    def _record_trajectory(self, prompt_index: int, run_index: int, trajectory: Trajectory, toolbox: Toolbox) -> None:
        prompt = self.prompts[prompt_index]
        item = {
            **scrub_json({key: value for key, value in prompt.items() if key != "prompt"}, self.ctx.scrub),
            "messages": scrub_json(trajectory.messages, self.ctx.scrub),
            "tools": toolbox.schemas(),
            "completed": trajectory.completed,
            "collection_id": self.id,
            "prompt_index": prompt_index,
            "run_index": run_index,
            "model": self.params["model"],
            "finish_reasons": trajectory.finish_reasons,
        }
        try:
            record = import_openai(item)
        except ConversionError as error:
            self._record_failure(prompt_index, run_index, error)
            return
        # The tool schemas are the same for every record: declared_tools keeps their names.
        record = replace(record, metadata={k: v for k, v in record.metadata.items() if k != "tools"})
        has_reasoning = reasoning_stats(record).has_any_reasoning
        outcome = {
            "api_calls": trajectory.api_calls,
            "tool_calls": trajectory.tool_calls,
            "has_reasoning": has_reasoning,
            "completed": trajectory.completed,
        }
        # Default on (docs/DATASETS.md#collections-the-batch-runner); a collection stored before the default
        # changed has the key written out, so the default here only covers a hand-made params file.
        if self.params.get("discard_without_reasoning", True) and not has_reasoning:
            self._save_item(prompt_index, run_index, DISCARDED, "no_reasoning", **outcome)
            return
        path = self._item_path(prompt_index, run_index)
        write_json_atomically(path, record_to_dict(record))
        self._save_item(prompt_index, run_index, KEPT, None, **outcome)
        limit = self.ctx.settings.collection_max_bytes
        with self._lock:
            self._kept_bytes += path.stat().st_size
            if self._kept_bytes > limit and self._unreachable is None:
                self._unreachable = (
                    f"the collection's kept trajectories hold {self._kept_bytes} bytes, over "
                    f"RLCTL_COLLECTION_MAX_BYTES ({limit}); kept items stay: raise the limit and resume to go on"
                )

    def _record_failure(self, prompt_index: int, run_index: int, error: Exception, connection: bool = False) -> None:
        reason = self.ctx.scrub(f"{type(error).__name__}: {error}")[:2000]
        self._save_item(prompt_index, run_index, FAILED, reason)
        with self._lock:
            if not connection:
                self._consecutive_connection_failures = 0
                return
            self._consecutive_connection_failures += 1
            if self._consecutive_connection_failures >= max(3, self.params["concurrency"]):
                self._unreachable = (
                    f"the chat endpoint {self.params['base_url']} could not be reached "
                    f"({self._consecutive_connection_failures} attempts in a row); last error: {reason}"
                )

    def _save_item(self, prompt_index: int, run_index: int, status: str, reason: str | None, **outcome: Any) -> None:
        with self.ctx.db.session() as session:
            row = session.scalars(
                select(CollectionItem).where(
                    CollectionItem.collection_id == self.id,
                    CollectionItem.prompt_index == prompt_index,
                    CollectionItem.run_index == run_index,
                )
            ).one_or_none()
            if row is None:
                row = CollectionItem(collection_id=self.id, prompt_index=prompt_index, run_index=run_index, attempts=0)
                session.add(row)
            row.status, row.reason, row.finished_at = status, reason, utcnow()
            row.attempts = (row.attempts or 0) + 1
            for key, value in outcome.items():
                setattr(row, key, value)
        with self._lock:
            if status in DONE_STATUSES:
                self._done += 1

    def _item_path(self, prompt_index: int, run_index: int) -> Path:
        directory = self.directory / "items"
        directory.mkdir(parents=True, exist_ok=True)
        return directory / f"{prompt_index}-{run_index}.json"

    def _done_pairs(self) -> set[tuple[int, int]]:
        with self.ctx.db.session() as session:
            rows = session.execute(
                select(CollectionItem.prompt_index, CollectionItem.run_index).where(
                    CollectionItem.collection_id == self.id, CollectionItem.status.in_(DONE_STATUSES)
                )
            ).all()
        return {(prompt, run) for prompt, run in rows}

    # --- the dataset ---

    def _finished_output(self) -> dict[str, Any] | None:
        try:
            dataset = get_dataset(self.ctx, self.params["output_id"])
        except NotFound:
            return None
        return {"collection_id": self.id, "dataset_id": dataset.id, **dataset.report}

    def _build_dataset(self, name: str) -> dict[str, Any]:
        with self.ctx.db.session() as session:
            rows = session.execute(
                select(CollectionItem.prompt_index, CollectionItem.run_index, CollectionItem.status)
                .where(CollectionItem.collection_id == self.id)
                .order_by(CollectionItem.prompt_index, CollectionItem.run_index)
            ).all()
            first_reason: dict[str, str | None] = {
                status: session.scalar(
                    select(CollectionItem.reason).where(
                        CollectionItem.collection_id == self.id, CollectionItem.status == status
                    )
                )
                for status in (FAILED, DISCARDED)
            }
        counts: dict[str, int] = {
            status: sum(1 for *_, s in rows if s == status) for status in (KEPT, DISCARDED, FAILED)
        }
        if counts[KEPT] == 0:
            raise JobFailed(_nothing_collected(counts, first_reason))
        counter = load_counter(self.ctx.settings, resolve_tokenizer(self.ctx.settings, None))
        builder = DatasetBuilder(dataset_store(self.ctx), f"collect-{self.id}", counter)
        try:
            for prompt_index, run_index, status in rows:
                if status == KEPT:
                    builder.add(self._load_item(prompt_index, run_index))
        except BaseException:
            builder.abort()
            raise
        report: dict[str, Any] = {
            "total": self.total,
            **counts,
            "collection_id": self.id,
            "model": self.params["model"],
        }
        # Scrubbed at creation; again here for a collection stored before that (a secret in its system prompt).
        parameters = scrub_json({k: v for k, v in self.params.items() if k != "output_id"}, self.ctx.scrub)
        row = builder.finish(
            self.ctx.db.session,
            self.params["output_id"],
            name=name,
            operation="collect",
            parameters=parameters,
            source_format="openai",
            report=report,
        )
        return {"collection_id": self.id, "dataset_id": row["id"], **report}

    def _load_item(self, prompt_index: int, run_index: int) -> TrajectoryRecord:
        path = self._item_path(prompt_index, run_index)
        return record_from_dict(json.loads(path.read_text(encoding="utf-8")))


class ResponseTooLarge(openai.OpenAIError):
    """An OpenAI error: the SDK raises it as it is (no retry, not taken for a connection error)."""


class _LimitedStream(httpx2.SyncByteStream):
    def __init__(self, stream: httpx2.SyncByteStream, limit: int) -> None:
        self._stream, self._limit = stream, limit

    def __iter__(self) -> Iterator[bytes]:
        received = 0
        for chunk in self._stream:
            received += len(chunk)
            if received > self._limit:
                raise ResponseTooLarge(f"the endpoint's answer is over {self._limit} bytes")
            yield chunk

    def close(self) -> None:
        self._stream.close()


class LimitedTransport(httpx2.HTTPTransport):
    """Reads at most `limit` bytes of an answer, whatever it declares: a model endpoint cannot fill the memory."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        response = super().handle_request(request)
        assert isinstance(response.stream, httpx2.SyncByteStream)
        return httpx2.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_LimitedStream(response.stream, self.limit),
            extensions=response.extensions,
            request=request,
        )


def _read_prompts(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _cancel_requested(ctx: AppContext, job_id: str) -> bool:
    with ctx.db.session() as session:
        return bool(session.scalar(select(Job.cancel_requested).where(Job.id == job_id)))
