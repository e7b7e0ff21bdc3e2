"""The run's inference server: SGLang's `/generate` for atroposlib's managed server, and the OpenAI API.

It runs inside the trainer process (uvicorn on a thread) and samples through the training backend, so every
answer comes from the newest published weights. Logprobs are those of the model itself (temperature 1), the
same quantity the trainer computes for the importance-sampling ratio.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, cast

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from rlctl.trainer.backends.base import Completion, SamplingRequest, SamplingRequestError, TrainingBackend
from rlctl.trainer.failures import FailureBudget
from rlctl.trainer.inference_guard import InferenceGuard
from rlctl.trajectories.tool_calls import ParsedToolCall, split_tool_calls

log = logging.getLogger(__name__)

DEFAULT_CHAT_MAX_TOKENS = 1024
MAX_SAMPLES_PER_REQUEST = 256
MAX_TOP_LOGPROBS = 20
SAMPLING_THREADS = 128


# The roles a chat message may have (OpenAI's; `developer` is read as `system`, as chat templates know no other).
Role = Literal["system", "developer", "user", "assistant", "tool"]
MAX_TEMPERATURE = 2.0  # OpenAI's range, [0, 2]
# Stable error codes of malformed requests, by the field at fault (anything else: `invalid_request`).
FIELD_CODES = {
    "role": "invalid_role",
    "temperature": "invalid_temperature",
    "presence_penalty": "invalid_penalty",
    "frequency_penalty": "invalid_penalty",
    "tool_choice": "invalid_tool_choice",
    "tools": "invalid_tools",
}


class InvalidRequest(ValueError):
    """A request the server cannot serve as asked (answered with 400 and `code`)."""

    def __init__(self, message: str, code: str = "invalid_request", param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param


class BackendFailed(RuntimeError):
    """The training backend failed to sample (answered with 502: the fault is upstream, not the caller's)."""


def _stop_list(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def _trim_at_stop(text: str, completion: Completion) -> str:
    if isinstance(completion.matched_stop, str):
        index = text.find(completion.matched_stop)
        return text[:index] if index >= 0 else text
    return text


class GenerateSamplingParams(BaseModel):
    n: int = Field(1, ge=1, le=MAX_SAMPLES_PER_REQUEST)
    max_new_tokens: int = Field(128, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None

    model_config = {"extra": "ignore"}


class GenerateRequest(BaseModel):
    input_ids: list[int] | None = None
    text: str | None = None
    sampling_params: GenerateSamplingParams = Field(default_factory=GenerateSamplingParams)
    return_logprob: bool = True
    top_logprobs_num: int = Field(0, ge=0, le=MAX_TOP_LOGPROBS)

    model_config = {"extra": "ignore"}


class CompletionRequest(BaseModel):
    model: str | None = None
    prompt: str | list[int] | list[str]
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=MAX_SAMPLES_PER_REQUEST)
    stop: str | list[str] | None = None
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    seed: int | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    stream: bool = False
    stream_options: StreamOptions | None = None

    model_config = {"extra": "ignore"}


class ContentPart(BaseModel):
    type: str
    text: str | None = None

    model_config = {"extra": "allow"}


class ChatMessage(BaseModel):
    role: Role
    content: str | list[ContentPart] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    model_config = {"extra": "allow"}


class StreamOptions(BaseModel):
    include_usage: bool = False

    model_config = {"extra": "ignore"}


class ChatCompletionRequest(BaseModel):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1, le=MAX_SAMPLES_PER_REQUEST)
    stop: str | list[str] | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    seed: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    stream: bool = False
    stream_options: StreamOptions | None = None

    model_config = {"extra": "ignore"}


def template_message(message: ChatMessage) -> dict[str, Any]:
    """An OpenAI message as chat templates expect it: text content (content parts joined; null is empty),
    tool calls with their arguments as a mapping, and the tool message's call id and name."""
    if isinstance(message.content, list):
        kinds = {part.type for part in message.content} - {"text", "input_text"}
        if kinds:
            raise InvalidRequest(f"only text content parts are supported, not {sorted(kinds)}")
        content = "".join(part.text or "" for part in message.content)
    else:
        content = message.content or ""
    role = "system" if message.role == "developer" else message.role
    rendered: dict[str, Any] = {"role": role, "content": content}
    if message.tool_calls:
        rendered["tool_calls"] = [_template_tool_call(call) for call in message.tool_calls]
    if message.tool_call_id is not None:
        rendered["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        rendered["name"] = message.name
    return rendered


def _template_tool_call(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            function["arguments"] = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as error:
            raise InvalidRequest(f"tool call arguments are not JSON: {error}") from error
    return {"type": call.get("type", "function"), "id": call.get("id"), "function": function}


def _openai_error(
    status: int, message: str, kind: str = "invalid_request_error", code: str | None = None, param: str | None = None
) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "code": code, "param": param}}
    return JSONResponse(status_code=status, content=body)


def _validation_message(error: RequestValidationError) -> str:
    """FastAPI's validation errors as one readable line: an OpenAI client shows only the message."""
    parts = []
    for problem in error.errors()[:5]:
        parts.append(f"{_where(problem) or 'body'}: {problem.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


def _where(problem: Any) -> str:
    return ".".join(str(part) for part in problem.get("loc", ()) if part != "body")


def _validation_code(error: RequestValidationError) -> tuple[str, str | None]:
    """The stable code and the field (OpenAI's `param`) of the first problem."""
    problems = error.errors()
    if not problems:
        return "invalid_request", None
    fields = [part for part in problems[0].get("loc", ()) if isinstance(part, str) and part != "body"]
    code = next((FIELD_CODES[field] for field in reversed(fields) if field in FIELD_CODES), "invalid_request")
    return code, _where(problems[0]) or None


def request_tools(body: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """The request's tools as chat templates take them, checked against `tool_choice`; None when the model is not to
    see any (no tools, or `tool_choice: "none"`). Each is OpenAI's `{"type": "function", "function": {...}}`, as vLLM
    and transformers hand tools to a template and as a tool environment rendered them in training
    (rlctl/environment_kit/agents.py): a checkpoint served here sees the prompt it was trained on. A bare function
    object is wrapped so."""
    tools = body.tools or []
    functions = [tool.get("function", tool) if isinstance(tool, dict) else None for tool in tools]
    names = set()
    for index, function in enumerate(functions):
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"tools[{index}] needs a function name", "invalid_tools", f"tools.{index}")
        names.add(name)
    choice = body.tool_choice
    if isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if choice.get("type") != "function" or name not in names:
            raise InvalidRequest(
                'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": N}} '
                "naming one of the request's tools",
                "invalid_tool_choice",
                "tool_choice",
            )
    elif choice == "required" and not names:
        raise InvalidRequest('tool_choice "required" needs tools', "invalid_tool_choice", "tool_choice")
    if choice == "none" or not functions:
        return None
    return [{"type": "function", "function": function} for function in cast(list[dict[str, Any]], functions)]


def check_penalties(body: CompletionRequest | ChatCompletionRequest) -> None:
    """Penalties in range but not 0 are refused, not ignored: the samplers do not apply them."""
    for field in ("presence_penalty", "frequency_penalty"):
        if getattr(body, field):
            raise InvalidRequest(f"{field} is not supported (only 0)", "unsupported_parameter", field)


def openai_tool_call(call: ParsedToolCall) -> dict[str, Any]:
    """A parsed call in OpenAI's shape, its arguments as JSON text."""
    call_id = call.id or f"call_{uuid.uuid4().hex[:24]}"
    return {"id": call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments_json()}}


class UnknownModel(LookupError):
    """A request named a model this server does not serve (answered with 404, as OpenAI does)."""


class InferenceService:
    """Request handling, independent of the HTTP framework's routing."""

    def __init__(
        self, backend: TrainingBackend, model_names: Sequence[str] = (), sampling_budget: FailureBudget | None = None
    ) -> None:
        self.backend = backend
        self.sampling_budget = sampling_budget
        self.tokenizer = backend.tokenizer
        # The ids a request may name (like vLLM's --served-model-name): the short ones first (the run's name
        # and id), then the backend's own, which may be a server path.
        self.model_names = tuple(dict.fromkeys([*model_names, backend.model_name]))
        # Served requests and completions per endpoint, shown by /health: proof that rollouts flow.
        self.counters: Counter[str] = Counter()
        # Enough threads for every request a batch may combine (asyncio's default pool has cores + 4): a
        # backend that batches waiting requests sees them all at once (docs/TRAINER.md#local-sampling).
        self._sampling_threads = ThreadPoolExecutor(SAMPLING_THREADS, thread_name_prefix="sampling")

    async def sample(self, request: SamplingRequest, endpoint: str) -> list[Completion]:
        # The caller's faults are answered 400 before the backend sees them: they never spend the run's failure
        # budget (206 requests naming a token id past the vocabulary once ended a run `sampling_failed`).
        self._check_tokens(request.prompt_tokens)
        try:
            loop = asyncio.get_running_loop()
            completions = await loop.run_in_executor(self._sampling_threads, self.backend.sample, request)
        except SamplingRequestError as error:
            raise InvalidRequest(str(error)) from error
        except Exception as error:  # noqa: BLE001 - any backend fault is the upstream's: counted, answered 502
            log.warning("sampling failed: %s: %s", type(error).__name__, error)
            self.counters["failed"] += 1
            if self.sampling_budget is not None:
                self.sampling_budget.failure(error)
            raise BackendFailed(f"the training backend failed to sample: {type(error).__name__}: {error}") from error
        if self.sampling_budget is not None:
            self.sampling_budget.success()
        self.counters[endpoint] += 1
        self.counters["completions"] += len(completions)
        return completions

    def _check_tokens(self, tokens: Sequence[int]) -> None:
        vocabulary = len(self.tokenizer)
        wrong = next((token for token in tokens if not 0 <= token < vocabulary), None)
        if wrong is not None:
            raise InvalidRequest(f"token id {wrong} is outside the vocabulary (0 to {vocabulary - 1})")

    def check_model(self, model: str | None) -> None:
        """No model means the default one; an id this server does not serve is an error, not silently ignored."""
        if model is not None and model not in self.model_names:
            raise UnknownModel(model)

    def token_text(self, token: int) -> str:
        return self.tokenizer.decode([token])

    def completion_text(self, completion: Completion) -> str:
        return _trim_at_stop(self.tokenizer.decode(completion.tokens, skip_special_tokens=True), completion)

    # --- SGLang /generate ---------------------------------------------------------------------------

    async def generate(self, body: GenerateRequest) -> dict[str, Any] | list[dict[str, Any]]:
        if body.input_ids is None and body.text is None:
            raise InvalidRequest("give input_ids or text")
        prompt = body.input_ids if body.input_ids is not None else self.tokenizer.encode(body.text)
        params = body.sampling_params
        completions = await self.sample(
            SamplingRequest(
                prompt_tokens=list(prompt),
                n=params.n,
                max_new_tokens=params.max_new_tokens,
                temperature=params.temperature,
                top_p=params.top_p,
                stop=_stop_list(params.stop),
                stop_token_ids=tuple(params.stop_token_ids or ()),
                top_logprobs=body.top_logprobs_num,
                seed=params.seed,
            ),
            "generate",
        )
        results = [self._generate_result(prompt, completion, body) for completion in completions]
        return results[0] if params.n == 1 else results

    def _generate_result(self, prompt: list[int], completion: Completion, body: GenerateRequest) -> dict[str, Any]:
        if completion.finish_reason == "length":
            finish: dict[str, Any] = {"type": "length", "length": len(completion.tokens)}
        else:
            finish = {"type": "stop", "matched": completion.matched_stop}
        meta: dict[str, Any] = {
            "id": uuid.uuid4().hex,
            "prompt_tokens": len(prompt),
            "completion_tokens": len(completion.tokens),
            "finish_reason": finish,
            "weights_version": (
                completion.weights_version if completion.weights_version is not None else self.backend.published.version
            ),
        }
        if body.return_logprob:
            meta["output_token_logprobs"] = [
                [logprob, token, None] for logprob, token in zip(completion.logprobs, completion.tokens, strict=True)
            ]
            if completion.top_logprobs is not None:
                meta["output_top_logprobs"] = [
                    [[value, token, None] for token, value in position] for position in completion.top_logprobs
                ]
        return {"text": self.completion_text(completion), "output_ids": completion.tokens, "meta_info": meta}

    # --- OpenAI ----------------------------------------------------------------------------------

    def _prompts(self, prompt: str | list[int] | list[str]) -> list[list[int]]:
        if isinstance(prompt, str):
            return [self.tokenizer.encode(prompt, add_special_tokens=False)]
        if prompt and all(isinstance(item, str) for item in prompt):
            return [self.tokenizer.encode(item, add_special_tokens=False) for item in prompt]
        return [list(cast(list[int], prompt))]  # neither a text nor texts: one prompt of token ids

    async def completions(self, body: CompletionRequest) -> dict[str, Any]:
        self.check_model(body.model)
        check_penalties(body)
        if body.echo:
            raise InvalidRequest("echo is not supported")
        choices: list[dict[str, Any]] = []
        prompt_tokens = completion_tokens = 0
        for prompt in self._prompts(body.prompt):
            completions = await self.sample(
                SamplingRequest(
                    prompt_tokens=prompt,
                    n=body.n,
                    max_new_tokens=body.max_tokens,
                    temperature=body.temperature,
                    top_p=body.top_p,
                    stop=_stop_list(body.stop),
                    top_logprobs=body.logprobs or 0,
                    seed=body.seed,
                ),
                "completions",
            )
            prompt_tokens += len(prompt)
            for completion in completions:
                completion_tokens += len(completion.tokens)
                choices.append(
                    {
                        "index": len(choices),
                        "text": self.completion_text(completion),
                        "finish_reason": completion.finish_reason,
                        "logprobs": self._legacy_logprobs(completion) if body.logprobs is not None else None,
                    }
                )
        return self._envelope("text_completion", body.model, choices, prompt_tokens, completion_tokens)

    def _legacy_logprobs(self, completion: Completion) -> dict[str, Any]:
        texts = [self.token_text(token) for token in completion.tokens]
        offsets, position = [], 0
        for text in texts:
            offsets.append(position)
            position += len(text)
        top = None
        if completion.top_logprobs is not None:
            top = [{self.token_text(token): value for token, value in position} for position in completion.top_logprobs]
        return {
            "tokens": texts,
            "token_logprobs": completion.logprobs,
            "top_logprobs": top,
            "text_offset": offsets,
        }

    async def chat_completions(self, body: ChatCompletionRequest) -> dict[str, Any]:
        self.check_model(body.model)
        check_penalties(body)
        messages = [template_message(message) for message in body.messages]
        tools = request_tools(body)
        try:
            text = self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        except Exception as error:  # templates raise many kinds of errors for odd conversations
            raise InvalidRequest(f"cannot apply the chat template: {error}") from error
        prompt = self.tokenizer.encode(text, add_special_tokens=False)
        max_tokens = body.max_completion_tokens or body.max_tokens or DEFAULT_CHAT_MAX_TOKENS
        top_logprobs = body.top_logprobs or 0
        completions = await self.sample(
            SamplingRequest(
                prompt_tokens=prompt,
                n=body.n,
                max_new_tokens=max_tokens,
                temperature=body.temperature,
                top_p=body.top_p,
                stop=_stop_list(body.stop),
                top_logprobs=top_logprobs if body.logprobs else 0,
                seed=body.seed,
            ),
            "chat_completions",
        )
        choices = [
            {
                "index": index,
                **self._chat_message(completion, parse_tool_calls=tools is not None),
                "logprobs": self._chat_logprobs(completion, top_logprobs) if body.logprobs else None,
            }
            for index, completion in enumerate(completions)
        ]
        completion_tokens = sum(len(completion.tokens) for completion in completions)
        return self._envelope("chat.completion", body.model, choices, len(prompt), completion_tokens)

    def _chat_message(self, completion: Completion, parse_tool_calls: bool) -> dict[str, Any]:
        """The choice's message and finish reason. When the model was given tools, its `<tool_call>` blocks
        become `tool_calls` (finish reason `tool_calls`); a malformed block stays in the content as text."""
        text = self.completion_text(completion)
        parsed = split_tool_calls(text) if parse_tool_calls else None
        if parsed is None or not parsed.tool_calls:
            return {"message": {"role": "assistant", "content": text}, "finish_reason": completion.finish_reason}
        message = {
            "role": "assistant",
            "content": parsed.content or None,
            "tool_calls": [openai_tool_call(call) for call in parsed.tool_calls],
        }
        return {"message": message, "finish_reason": "tool_calls"}

    def _chat_logprobs(self, completion: Completion, top_logprobs: int) -> dict[str, Any]:
        content = []
        for index, (token, logprob) in enumerate(zip(completion.tokens, completion.logprobs, strict=True)):
            text = self.token_text(token)
            alternatives = []
            if top_logprobs and completion.top_logprobs is not None:
                alternatives = [
                    {
                        "token": self.token_text(other),
                        "logprob": value,
                        "bytes": list(self.token_text(other).encode()),
                    }
                    for other, value in completion.top_logprobs[index][:top_logprobs]
                ]
            content.append(
                {
                    "token": text,
                    "logprob": logprob,
                    "bytes": list(text.encode()),
                    "top_logprobs": alternatives,
                }
            )
        return {"content": content, "refusal": None}

    def _envelope(
        self,
        kind: str,
        model: str | None,
        choices: list[dict[str, Any]],
        prompt_tokens: int,
        completion_tokens: int,
    ) -> dict[str, Any]:
        prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
        return {
            "id": f"{prefix}-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": model or self.backend.model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }


def stream_events(response: dict[str, Any], include_usage: bool) -> Iterator[str]:
    """A finished response as OpenAI's server-sent events: per choice a first chunk (the role, for chat), its
    content, and its finish reason; then a chunk with the usage when asked; then `[DONE]`. Sampling is not
    incremental here, so the text comes in one chunk per choice; clients read it as any stream."""
    chat = response["object"] == "chat.completion"
    envelope = {
        "id": response["id"],
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": response["created"],
        "model": response["model"],
    }

    def event(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> str:
        chunk = {**envelope, "choices": choices}
        if include_usage:
            chunk["usage"] = usage
        return f"data: {json.dumps(chunk)}\n\n"

    for choice in response["choices"]:
        index = choice["index"]
        if chat:
            message = choice["message"]
            yield event([{"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
            if message["content"] or not message.get("tool_calls"):
                delta = {"content": message["content"]}
                yield event([{"index": index, "delta": delta, "logprobs": choice["logprobs"], "finish_reason": None}])
            if message.get("tool_calls"):  # whole calls in one chunk, as sampling is not incremental
                calls = [{"index": number, **call} for number, call in enumerate(message["tool_calls"])]
                yield event([{"index": index, "delta": {"tool_calls": calls}, "finish_reason": None}])
            yield event([{"index": index, "delta": {}, "finish_reason": choice["finish_reason"]}])
        else:
            yield event(
                [{"index": index, "text": choice["text"], "logprobs": choice["logprobs"], "finish_reason": None}]
            )
            yield event([{"index": index, "text": "", "logprobs": None, "finish_reason": choice["finish_reason"]}])
    if include_usage:
        yield event([], response["usage"])
    yield "data: [DONE]\n\n"


def _answer(content: dict[str, Any] | list[dict[str, Any]]) -> JSONResponse:
    """The sampling routes' answer, encoded as is. Returned as a dict, FastAPI would first walk it with
    `jsonable_encoder`, one Python call per value: a chat completion of 8 choices of 8 tokens with logprobs took
    8.1 ms that way against 0.66 ms for `json.dumps` alone (issue 40: 6-12 ms of each training step went to JSON).
    These answers hold only JSON's own types (str, int, float, list, dict, None), so the walk changes nothing;
    `tests/trainer/test_inference_server.py` reads them back."""
    return JSONResponse(content)


def _maybe_streamed(
    response: dict[str, Any], stream: bool, options: StreamOptions | None
) -> JSONResponse | StreamingResponse:
    if not stream:
        return _answer(response)
    include_usage = options is not None and options.include_usage
    return StreamingResponse(stream_events(response, include_usage), media_type="text/event-stream")


def create_app(
    backend: TrainingBackend,
    model_names: Sequence[str] = (),
    sampling_budget: FailureBudget | None = None,
    api_key: str | None = None,
) -> FastAPI:
    """`model_names`: extra ids the OpenAI routes answer to, besides the backend's model name. Every error is
    answered in OpenAI's shape `{"error": {"message", "type", "code"}}`, never a bare 500. With `api_key` (the
    run's RLCTL_RUN_INFERENCE_KEY) every route but /health needs it; bodies are bounded either way."""
    service = InferenceService(backend, model_names, sampling_budget)
    app = FastAPI(title="rlctl inference server", docs_url=None, redoc_url=None)
    app.add_middleware(InferenceGuard, key=api_key)

    @app.exception_handler(InvalidRequest)
    async def invalid_request(_: Request, error: InvalidRequest) -> JSONResponse:
        return _openai_error(400, str(error), code=error.code, param=error.param)

    @app.exception_handler(RequestValidationError)
    async def malformed_request(_: Request, error: RequestValidationError) -> JSONResponse:
        code, param = _validation_code(error)
        return _openai_error(400, _validation_message(error), code=code, param=param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if error.status_code < 500 else "server_error"
        return _openai_error(error.status_code, str(error.detail), kind)

    @app.exception_handler(BackendFailed)
    async def backend_failed(_: Request, error: BackendFailed) -> JSONResponse:
        return _openai_error(502, str(error), "server_error", code="backend_error")

    @app.exception_handler(Exception)
    async def internal_error(_: Request, error: Exception) -> JSONResponse:
        log.exception("inference request failed")
        return _openai_error(500, f"internal error: {type(error).__name__}", "server_error", code="internal_error")

    @app.exception_handler(UnknownModel)
    async def unknown_model(_: Request, error: UnknownModel) -> JSONResponse:
        return _openai_error(404, f"The model `{error.args[0]}` does not exist.", code="model_not_found")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "model": backend.model_name,
            "weights_version": backend.published.version,
            "served": dict(service.counters),
        }

    def model_entry(name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": 0, "owned_by": "rlctl"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_entry(name) for name in service.model_names]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> dict[str, Any]:
        service.check_model(model)
        return model_entry(model)

    @app.post("/generate", response_model=None)
    async def generate(body: GenerateRequest) -> JSONResponse:
        return _answer(await service.generate(body))

    # A stream starts only once sampling has succeeded, so every error is still an ordinary JSON error body.
    @app.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest) -> JSONResponse | StreamingResponse:
        return _maybe_streamed(await service.completions(body), body.stream, body.stream_options)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest) -> JSONResponse | StreamingResponse:
        return _maybe_streamed(await service.chat_completions(body), body.stream, body.stream_options)

    return app


class InferenceServer:
    """uvicorn serving the app on a background thread of the trainer process."""

    def __init__(self, app: FastAPI, host: str, port: int) -> None:
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="inference-server", daemon=True)
        self.address = f"http://{host}:{port}"

    def start(self, timeout_s: float = 30.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the inference server could not start on {self.address} (port in use?)")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the inference server did not start on {self.address} within {timeout_s} s")
            time.sleep(0.02)
        log.info("inference server listening on %s", self.address)

    def stop(self, timeout_s: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=timeout_s)
