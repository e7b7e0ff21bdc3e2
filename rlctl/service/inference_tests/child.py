"""Run in a child process: one model's inference test, through the environment's own atroposlib `process` mode.

    python -m rlctl.service.inference_tests.child ENV_FILE CLASS CONFIG_YAML RECORDS_JSONL

The environment builds its prompts, calls the endpoint and scores the replies with its own methods; this module
only watches, through two hooks:

- every request of the `openai` client is timed (each completion gets the duration of the request that
  returned it); an answer the endpoint will never change (401, 403, 404, 400, 422) or a malformed one ends the
  run at once, instead of atroposlib's nine retries;
- every scored group handed to `handle_send_to_api` is recorded before atroposlib's own filters, so a group of
  equal scores still counts.

It also leaves out the HTML page of the groups that `process` mode renders at its end (its markdown was a seventh
of a model's CPU): the groups reach the parent through the recorder, and the work directory is deleted.

RECORDS_JSONL gets one line per step, `{"step", "scores", "completions", "latencies_s", "messages"}`, then one
last line `{"event": "finished"}` or `{"event": "error", "kind", "message"}`. The key reaches this process
only as OPENAI_API_KEY in its environment (the YAML names none); the parent scrubs everything printed here.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import IO, Any

# Answers that retrying cannot change: a bad key, no access, no such model, a request the endpoint refuses.
FATAL_STATUSES = {400, 401, 403, 404, 422}
UNREACHABLE_ERRORS = {"APIConnectionError", "APITimeoutError"}
PARENT_CHECK_INTERVAL_S = 1.0


class EndpointRejected(BaseException):
    """Not an Exception: neither atroposlib's retries nor an environment's `except Exception` may swallow it."""


class MalformedResponse(BaseException):
    """The endpoint answered something that is not a completion."""


class Recorder:
    def __init__(self, path: Path) -> None:
        self._file: IO[str] = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()
        self._requests: list[tuple[float, int]] = []  # (seconds, completions returned) since the last group
        self.step = 0

    def request_done(self, seconds: float, completions: int) -> None:
        with self._lock:
            self._requests.append((seconds, completions))

    def take_latencies(self) -> list[float]:
        with self._lock:
            requests, self._requests = self._requests, []
        return [round(seconds, 4) for seconds, count in requests for _ in range(count)]

    def group_scored(self, env: Any, scored: Any) -> None:
        groups = [g for g in (scored if isinstance(scored, list) else [scored]) if g]
        if not groups:
            return
        self.step += 1
        record: dict[str, Any] = {"step": self.step, "scores": [], "completions": [], "messages": []}
        for group in groups:
            record["scores"].extend(float(s) for s in group.get("scores") or [])
            record["completions"].extend(_completion_texts(env, group))
            record["messages"].extend(group.get("messages") or [])
        record["latencies_s"] = self.take_latencies()
        correct = sum(1 for s in record["scores"] if s > 0)
        print(f"[inference test] step {self.step}: {len(record['scores'])} completions, {correct} correct", flush=True)
        self.write(record)

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _completion_texts(env: Any, group: dict[str, Any]) -> list[str]:
    """The replies: the last assistant message of each conversation, else the unmasked tokens decoded."""
    messages = group.get("messages") or []
    texts = []
    for index, tokens in enumerate(group.get("tokens") or []):
        conversation = messages[index] if index < len(messages) else None
        if conversation and isinstance(conversation[-1], dict) and conversation[-1].get("role") == "assistant":
            texts.append(str(conversation[-1].get("content") or ""))
            continue
        masks = (group.get("masks") or [])[index] if index < len(group.get("masks") or []) else tokens
        texts.append(env.tokenizer.decode([t for t, m in zip(tokens, masks, strict=False) if m != -100]))
    return texts


def install_hooks(env_class: type[Any], recorder: Recorder) -> None:
    import openai
    from openai.resources.chat.completions import AsyncCompletions as AsyncChatCompletions
    from openai.resources.completions import AsyncCompletions

    def timed(create: Any, kind: str) -> Any:
        async def timed_create(self: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                response = await create(self, *args, **kwargs)
            except openai.APIStatusError as error:
                if error.status_code in FATAL_STATUSES:
                    raise EndpointRejected(_rejection(error, kwargs.get("model"))) from error
                raise
            except openai.APIResponseValidationError as error:
                raise MalformedResponse(f"the endpoint's answer is not a {kind}: {error}") from error
            _check_shape(response, kind)
            recorder.request_done(time.perf_counter() - started, len(response.choices))
            return response

        return timed_create

    # The SDK has no hook for timing each request: its create methods are wrapped in this child process only.
    AsyncChatCompletions.create = timed(AsyncChatCompletions.create, "chat completion")  # type: ignore[method-assign]
    AsyncCompletions.create = timed(AsyncCompletions.create, "completion")  # type: ignore[method-assign]

    original_send = env_class.handle_send_to_api

    async def observed_send(self: Any, scored_data: Any, *args: Any, **kwargs: Any) -> Any:
        recorder.group_scored(self, scored_data)
        return await original_send(self, scored_data, *args, **kwargs)

    env_class.handle_send_to_api = observed_send

    import atroposlib.envs.base as atropos_base

    atropos_base.generate_html = lambda *args, **kwargs: None


def _rejection(error: Any, model: str | None) -> str:
    message = error.message
    body = getattr(error, "body", None)
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        message = body["message"]
    return f"the endpoint answered {error.status_code} for model {model!r}: {message}"


def _check_shape(response: Any, kind: str) -> None:
    choices = getattr(response, "choices", None)
    if not isinstance(choices, list) or not choices:
        raise MalformedResponse(f"the endpoint's answer is not a {kind}: it has no choices")
    for choice in choices:
        if kind == "chat completion":
            message = getattr(choice, "message", None)
            content = getattr(message, "content", None)
            if message is None or not (content is None or isinstance(content, str)):
                raise MalformedResponse("the endpoint's answer is not a chat completion: a choice has no message")
        elif not isinstance(getattr(choice, "text", None), str):
            raise MalformedResponse("the endpoint's answer is not a completion: a choice has no text")


def root_cause(error: BaseException) -> BaseException:
    """Through tenacity's RetryError (atroposlib retries every request) to the error of the last attempt."""
    seen = set()
    while id(error) not in seen:
        seen.add(id(error))
        last_attempt = getattr(error, "last_attempt", None)
        if last_attempt is None or not last_attempt.failed:
            break
        error = last_attempt.exception()
    return error


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def exit_with_parent() -> None:
    """The service that started this process is gone (its pipe no longer read): stop, leave nothing behind."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_INTERVAL_S)
        os._exit(3)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def run(env_file: Path, class_name: str, config: Path, recorder: Recorder) -> dict[str, Any]:
    from rlctl.service.environments.introspect import load_environment_class

    try:
        env_class = load_environment_class(env_file, class_name)
        install_hooks(env_class, recorder)
        sys.argv = [str(env_file), "process", "--config", str(config)]
        env_class.cli()  # atroposlib's CLI ends with sys.exit
    except SystemExit as exit_:
        if exit_.code in (0, None):
            return {"event": "finished"}
        return {"event": "error", "kind": "crashed", "message": f"the process command exited with {exit_.code}"}
    except EndpointRejected as error:
        return {"event": "error", "kind": "endpoint_rejected", "message": str(error)}
    except MalformedResponse as error:
        return {"event": "error", "kind": "malformed_response", "message": str(error)}
    except BaseException as error:  # noqa: BLE001 - every failure is reported to the parent
        traceback.print_exc()
        root = root_cause(error)
        if type(root).__name__ in UNREACHABLE_ERRORS:
            message = f"the endpoint could not be reached, even after retries ({describe(root)})"
            return {"event": "error", "kind": "endpoint_unreachable", "message": message}
        return {"event": "error", "kind": "crashed", "message": describe(root)}
    return {"event": "finished"}


def main(argv: list[str]) -> int:
    env_file, class_name, config, records = Path(argv[0]), argv[1], Path(argv[2]), Path(argv[3])
    exit_with_parent()
    recorder = Recorder(records)
    try:
        outcome = run(env_file, class_name, config, recorder)
        if outcome["event"] == "error":
            print(f"[inference test] {outcome['kind']}: {outcome['message']}", flush=True)
        recorder.write(outcome)
    finally:
        recorder.close()
    return 0 if outcome["event"] == "finished" else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
