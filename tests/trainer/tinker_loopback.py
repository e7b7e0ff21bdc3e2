"""A loopback server speaking the Tinker wire protocol, for the calls rlctl's trainer makes.

Why a stand-in: the real Tinker service is a paid remote service that cannot be reached from here. This server
implements just enough of the protocol of the installed `tinker` SDK (0.38.0) for the real SDK client to run
unmodified against it: client config, sessions and heartbeats, telemetry, model creation and info,
forward/backward (protobuf in and out), Adam steps, saving and loading weights, sampling (protobuf out) from
the trainer's published weights and from sampling sessions of saved sampler weights or of the base model, and
the long-polled `/api/v1/retrieve_future` through which every asynchronous call returns its result.

Behind the protocol is a real, if minimal, learner: a single vector of logits over the vocabulary (a unigram
model). Forward/backward computes the importance-sampling loss and its gradient, `optim_step` applies Adam
with the parameters sent, and sampling draws from the snapshot saved for the sampler. Every request is
recorded so tests can check what the trainer sent.

With `protocol="legacy"` it speaks the older protocol subset of `tinker>=0.25,<0.26`, as SkyRL 0.4 does: no
`/api/v1/sessions/{id}/finish`, asample promises without `sample_sequence_ids`, `load_weights` only addressed by
`model_id` and only as a model's first request after `create_model`, and request schemas published in its OpenAPI
document (copied from SkyRL's, so fields they do not declare are dropped as SkyRL drops them).

`replies` scripts the remote model's answers instead: a function of a sample's prompt tokens and a random generator
to one reply's tokens (its logprobs still the unigram model's), for tests of what an environment does with the
replies (a multi-turn tool environment's tool calls) rather than of learning.

Two knobs stand in for a remote service's timing: `latency_s` is added to every request (a network round trip),
and `hold_gradients` withholds each forward_backward result until an optim_step for the same model has arrived
(a client that waits for the gradients before sending the step never gets them; one that pipelines does).
"""

import asyncio
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from tinker.proto import tinker_public_pb2 as pb

from tests.support.waiting import wait_until

PROTOBUF = "application/x-protobuf"


@dataclass
class UnigramModel:
    """Logits over the vocabulary, trained with Adam; enough to show learning through the protocol."""

    vocab_size: int
    logits: np.ndarray = field(init=False)
    gradient: np.ndarray = field(init=False)
    first_moment: np.ndarray = field(init=False)
    second_moment: np.ndarray = field(init=False)
    steps: int = 0

    def __post_init__(self) -> None:
        self.logits = np.zeros(self.vocab_size)
        self.gradient = np.zeros(self.vocab_size)
        self.first_moment = np.zeros(self.vocab_size)
        self.second_moment = np.zeros(self.vocab_size)

    def log_probs(self, logits: np.ndarray | None = None) -> np.ndarray:
        values = self.logits if logits is None else logits
        shifted = values - values.max()
        return shifted - np.log(np.exp(shifted).sum())

    def importance_sampling(self, targets: np.ndarray, sampler: np.ndarray, advantages: np.ndarray) -> float:
        """Add the gradient of -(exp(logp - sampler_logp) * adv).sum() to the accumulator; return the loss."""
        log_probs = self.log_probs()
        weights = -np.exp(log_probs[targets] - sampler) * advantages  # d loss / d logp per position
        probabilities = np.exp(log_probs)
        np.add.at(self.gradient, targets, weights)
        self.gradient -= weights.sum() * probabilities
        return float(weights.sum())

    def adam(self, learning_rate: float, beta1: float, beta2: float, eps: float) -> None:
        self.steps += 1
        self.first_moment = beta1 * self.first_moment + (1 - beta1) * self.gradient
        self.second_moment = beta2 * self.second_moment + (1 - beta2) * self.gradient**2
        corrected_first = self.first_moment / (1 - beta1**self.steps)
        corrected_second = self.second_moment / (1 - beta2**self.steps)
        self.logits = self.logits - learning_rate * corrected_first / (np.sqrt(corrected_second) + eps)
        self.gradient = np.zeros(self.vocab_size)


LONG_POLL_S = 1.0  # how long retrieve_future waits on a withheld result before answering 408 (try again)


@dataclass
class StoredResult:
    payload: Any  # dict for JSON results, bytes for protobuf results
    model_id: str | None = None
    released: asyncio.Event | None = None  # withheld until set (hold_gradients); made on the server's loop

    @property
    def is_proto(self) -> bool:
        return isinstance(self.payload, bytes)


class LegacyLoraConfig(BaseModel):
    rank: int
    seed: int | None = None


class LegacyCreateModel(BaseModel):
    session_id: str
    base_model: str
    lora_config: LegacyLoraConfig
    model_role: str = "policy"


class LegacyAdamParams(BaseModel):
    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0


class LegacyOptimStep(BaseModel):
    model_id: str
    adam_params: LegacyAdamParams
    seq_id: int | None = None


class LegacyLoadWeights(BaseModel):
    model_id: str  # the 0.25 protocol has no create-via-load addressing: a body without it is a 422
    path: str
    optimizer: bool = True
    seq_id: int | None = None


class LegacySamplingParams(BaseModel):
    max_tokens: int | None = None
    seed: int | None = None
    stop: list[int] | list[str] | None = None
    temperature: float = 1
    top_k: int = -1
    top_p: float = 1


class LegacySample(BaseModel):
    num_samples: int = 1
    prompt: dict[str, Any]
    sampling_params: LegacySamplingParams
    sampling_session_id: str | None = None
    seq_id: int | None = None
    prompt_logprobs: bool | None = None
    topk_prompt_logprobs: int = 0


class LoopbackTinker:
    """State and handlers of the loopback service; `requests` records (endpoint, decoded body) pairs."""

    def __init__(
        self,
        vocab_size: int,
        eos_token_id: int | None = None,
        seed: int = 0,
        protocol: str = "current",
        latency_s: float = 0.0,
        hold_gradients: bool = False,
        replies: Callable[[list[int], np.random.Generator], list[int]] | None = None,
    ) -> None:
        self.protocol = protocol
        self.replies = replies
        self.reject_samples = False  # answer every sample with bytes the SDK cannot parse (a broken server)
        self.latency_s = latency_s
        self.hold_gradients = hold_gradients
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.requests: list[tuple[str, Any]] = []
        self.api_keys: set[str] = set()
        self.models: dict[str, UnigramModel] = {}
        self.checkpoints: dict[str, np.ndarray] = {}
        self.samplers: dict[str, np.ndarray] = {}
        self.sampler_sources: dict[str, str] = {}  # sampling session → the saved weights' path or the base model
        self.trained_models: set[str] = set()  # models that had a request other than create_model
        self.lora_ranks: dict[str, int] = {}
        self._results: dict[str, StoredResult] = {}
        self._lock = threading.Lock()
        self._rng = np.random.default_rng(seed)

    def record(self, endpoint: str, body: Any, request: Request) -> None:
        with self._lock:
            self.requests.append((endpoint, body))
            self.api_keys.add(request.headers.get("x-api-key", ""))

    def calls(self, endpoint: str) -> list[Any]:
        with self._lock:
            return [body for name, body in self.requests if name == endpoint]

    def future(self, payload: Any, model_id: str | None = None, held: bool = False, **extra: Any) -> dict[str, Any]:
        request_id = uuid.uuid4().hex
        self._results[request_id] = StoredResult(payload, model_id, asyncio.Event() if held else None)
        return {"request_id": request_id, "model_id": model_id, **extra}

    def release(self, model_id: str) -> None:
        for result in self._results.values():
            if result.model_id == model_id and result.released is not None:
                result.released.set()  # called on the server's loop, from a route

    # --- training -------------------------------------------------------------------------------

    def forward_backward(self, message: pb.ForwardBackwardRequest) -> bytes:
        model = self.models[message.model_id]
        self.trained_models.add(message.model_id)
        log_probs_per_datum: list[np.ndarray] = []
        loss = 0.0
        for datum in message.data:
            targets = _tensor(datum.loss_fn_inputs["target_tokens"]).astype(np.int64)
            log_probs_per_datum.append(model.log_probs()[targets].astype(np.float32))
            if message.loss_fn == "importance_sampling" and not message.forward_only:
                sampler = _tensor(datum.loss_fn_inputs["logprobs"])
                advantages = _tensor(datum.loss_fn_inputs["advantages"])
                loss += model.importance_sampling(targets, sampler, advantages)
        return _forward_backward_output(log_probs_per_datum, loss)

    def create_model(self, body: dict[str, Any]) -> dict[str, Any]:
        model_id = f"{body['session_id']}:train:{body['model_seq_id']}"
        self.models[model_id] = UnigramModel(self.vocab_size)
        self.lora_ranks[model_id] = body["lora_config"]["rank"]
        return self.future({"model_id": model_id, "type": "create_model"}, model_id)

    def optim_step(self, body: dict[str, Any]) -> dict[str, Any]:
        params = body["adam_params"]  # the wire name of AdamParams
        self.trained_models.add(body["model_id"])
        self.models[body["model_id"]].adam(params["learning_rate"], params["beta1"], params["beta2"], params["eps"])
        self.release(body["model_id"])
        return self.future({"metrics": {}}, body["model_id"])

    def load_weights(self, body: dict[str, Any]) -> dict[str, Any] | JSONResponse:
        if self.protocol == "legacy":  # into the model just created, as its first request
            model_id = body["model_id"]
            if model_id not in self.models or model_id in self.trained_models:
                return JSONResponse(status_code=400, content={"detail": "LoadWeights is not permitted"})
        else:  # create-via-load addressing
            model_id = f"{body['session_id']}:train:{body['model_seq_id']}"
        self.trained_models.add(model_id)
        model = UnigramModel(self.vocab_size)
        model.logits = self.checkpoints[body["path"]].copy()
        self.models[model_id] = model
        return self.future({"path": body["path"], "model_id": model_id, "type": "load_weights"}, model_id)

    def asample(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.protocol == "legacy":
            return self.future(self.sample(body), None)
        ids = [uuid.uuid4().hex for _ in range(int(body.get("num_samples", 1)))]
        return self.future(self.sample(body), None, sample_sequence_ids=ids)

    def sample(self, body: dict[str, Any]) -> bytes:
        if self.reject_samples:
            return b"\xff\xfe not a SampleResponse"
        logits = self.samplers[body["sampling_session_id"]]
        params = body.get("sampling_params", {})
        temperature = float(params.get("temperature", 1.0))
        max_tokens = int(params.get("max_tokens") or 16)
        log_probs = UnigramModel(self.vocab_size).log_probs(logits)
        scaled = np.exp(UnigramModel(self.vocab_size).log_probs(logits / max(temperature, 1e-6)))
        response = pb.SampleResponse()
        for _ in range(int(body.get("num_samples", 1))):
            if self.replies is not None:
                prompt = [int(token) for chunk in body["prompt"]["chunks"] for token in chunk["tokens"]]
                tokens = np.array(self.replies(prompt, self._rng)[:max_tokens], dtype=np.int64)
            else:
                tokens = self._rng.choice(self.vocab_size, size=max_tokens, p=scaled)
            stop_reason = pb.STOP_REASON_LENGTH
            if self.eos_token_id is not None and self.eos_token_id in tokens:
                tokens = tokens[: int(np.argmax(tokens == self.eos_token_id)) + 1]
                stop_reason = pb.STOP_REASON_STOP
            response.sequences.add(
                stop_reason=stop_reason,
                tokens=tokens.astype(np.int32).tobytes(),
                logprobs=log_probs[tokens].astype(np.float32).tobytes(),
            )
        return response.SerializeToString()


def _tensor(message: pb.Tensor) -> np.ndarray:
    dtype = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64}[message.dtype]
    return np.frombuffer(message.dense, dtype=dtype)


def _forward_backward_output(log_probs: list[np.ndarray], loss: float) -> bytes:
    sizes = [array.nbytes for array in log_probs]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    batched = pb.BatchedTensor(
        data=b"".join(array.tobytes() for array in log_probs),
        offsets=offsets.tobytes(),
        dtype=pb.DTYPE_FLOAT32,
    )
    output = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", metrics={"loss:sum": loss})
    output.loss_fn_outputs.add(type_tag="ArrayRecord", fields={"logprobs": batched}, num_datums=len(log_probs))
    return output.SerializeToString()


LEGACY_SCHEMAS: dict[str, type[BaseModel]] = {
    "create_model": LegacyCreateModel,
    "optim_step": LegacyOptimStep,
    "load_weights": LegacyLoadWeights,
    "asample": LegacySample,
}


def create_app(service: LoopbackTinker) -> FastAPI:
    app = FastAPI()

    if service.latency_s:

        @app.middleware("http")
        async def network_latency(request: Request, call_next: Any) -> Response:
            await asyncio.sleep(service.latency_s)
            return await call_next(request)

    async def json_body(request: Request, endpoint: str) -> dict[str, Any]:
        body = await request.json()
        service.record(endpoint, body, request)
        return body

    def json_route(endpoint: str, handle: Any) -> None:
        """POST /api/v1/<endpoint>; in legacy mode the body is validated against (and published as) its schema.

        (This module has no `from __future__ import annotations`: FastAPI reads `declared` from the annotation.)
        """
        declared = LEGACY_SCHEMAS.get(endpoint) if service.protocol == "legacy" else None
        if declared is None:

            async def route(request: Request) -> Any:
                return handle(await json_body(request, endpoint))

        else:

            async def route(request: Request, validated: declared) -> Any:  # type: ignore[valid-type]
                return handle(await json_body(request, endpoint))

        app.post(f"/api/v1/{endpoint}")(route)

    json_route("create_model", service.create_model)
    json_route("optim_step", service.optim_step)
    json_route("load_weights", service.load_weights)
    json_route("asample", service.asample)

    @app.post("/api/v1/client/config")
    async def client_config(request: Request) -> dict[str, Any]:
        await json_body(request, "client/config")
        return {"pjwt_auth_enabled": False, "sample_use_retrieve_futures": False}

    @app.post("/api/v1/client/dynamic_config")
    async def dynamic_config(request: Request) -> dict[str, Any]:
        await json_body(request, "client/dynamic_config")
        return {"refresh_interval_sec": 300}

    @app.post("/api/v1/create_session")
    async def create_session(request: Request) -> dict[str, Any]:
        await json_body(request, "create_session")
        return {"type": "create_session", "session_id": f"session-{uuid.uuid4().hex[:8]}"}

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat(request: Request) -> dict[str, Any]:
        await json_body(request, "session_heartbeat")
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/telemetry")
    async def telemetry(request: Request) -> dict[str, Any]:
        await request.body()
        return {"status": "accepted"}

    if service.protocol == "current":

        @app.post("/api/v1/sessions/{session_id}/finish")
        async def finish(session_id: str, request: Request) -> Response:
            await json_body(request, "finish_session")
            return Response(status_code=200, content=b"null", media_type="application/json")

    @app.post("/api/v1/get_info")
    async def get_info(request: Request) -> dict[str, Any]:
        body = await json_body(request, "get_info")
        return {
            "type": "get_info",
            "model_id": body["model_id"],
            "model_data": {"arch": "unigram", "model_name": "loopback-unigram", "tokenizer_id": None},
            "is_lora": True,
        }

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request) -> dict[str, Any]:
        message = pb.ForwardBackwardRequest()
        message.ParseFromString(await request.body())
        service.record("forward_backward", message, request)
        held = service.hold_gradients and not message.forward_only
        return service.future(service.forward_backward(message), message.model_id, held=held)

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_for_sampler(request: Request) -> dict[str, Any]:
        body = await json_body(request, "save_weights_for_sampler")
        snapshot = service.models[body["model_id"]].logits.copy()
        if body.get("path"):
            path = f"tinker://{body['model_id']}/sampler_weights/{body['path']}"
            service.checkpoints[path] = snapshot
            return service.future({"path": path, "type": "save_weights_for_sampler"}, body["model_id"])
        session = f"sampler-{uuid.uuid4().hex[:8]}"
        service.samplers[session] = snapshot
        result = {"sampling_session_id": session, "type": "save_weights_for_sampler"}
        return service.future(result, body["model_id"])

    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request) -> Any:
        """A sampler of saved sampler weights (`model_path`), or of the base model: a fresh, untrained model."""
        body = await json_body(request, "create_sampling_session")
        path = body.get("model_path")
        if path is not None and path not in service.checkpoints:
            return JSONResponse(status_code=404, content={"detail": f"no weights at {path}"})
        session = f"sampler-{uuid.uuid4().hex[:8]}"
        logits = service.checkpoints[path] if path is not None else UnigramModel(service.vocab_size).logits
        service.samplers[session] = logits.copy()
        service.sampler_sources[session] = path or body["base_model"]
        return {"type": "create_sampling_session", "sampling_session_id": session}

    @app.get("/api/v1/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str) -> dict[str, Any]:
        source = service.sampler_sources.get(sampler_id, "")
        path = source if source.startswith("tinker://") else None
        return {"sampler_id": sampler_id, "base_model": "loopback-unigram", "model_path": path}

    @app.post("/api/v1/weights_info")
    async def weights_info(request: Request) -> dict[str, Any]:
        body = await json_body(request, "weights_info")
        model_id = body["tinker_path"].removeprefix("tinker://").split("/")[0]
        return {"base_model": "loopback-unigram", "is_lora": True, "lora_rank": service.lora_ranks.get(model_id)}

    @app.post("/api/v1/save_weights")
    async def save_weights(request: Request) -> dict[str, Any]:
        body = await json_body(request, "save_weights")
        path = f"tinker://{body['model_id']}/weights/{body['path']}"
        service.checkpoints[path] = service.models[body["model_id"]].logits.copy()
        return service.future({"path": path, "type": "save_weights"}, body["model_id"])

    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(request: Request) -> Response:
        body = await request.json()
        result = service._results.get(body["request_id"])
        if result is None:
            return JSONResponse(status_code=404, content={"detail": "unknown request id"})
        if result.released is not None:  # a long poll, as the real service's
            try:
                await asyncio.wait_for(result.released.wait(), LONG_POLL_S)
            except TimeoutError:
                return JSONResponse(status_code=408, content={"type": "try_again", "queue_state": "active"})
        if result.is_proto:
            return Response(content=result.payload, media_type=PROTOBUF)
        return JSONResponse(content=result.payload)

    return app


class LoopbackServer:
    """Serves a LoopbackTinker on 127.0.0.1 from a background thread."""

    def __init__(self, service: LoopbackTinker, port: int) -> None:
        config = uvicorn.Config(create_app(service), host="127.0.0.1", port=port, log_level="warning")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self.url = f"http://127.0.0.1:{port}"

    def __enter__(self) -> "LoopbackServer":
        self._thread.start()

        def started() -> bool:
            if not self._thread.is_alive():
                raise RuntimeError("the loopback Tinker server did not start")
            return self._server.started

        wait_until(started, timeout=20, interval=0.02, message="the loopback Tinker server starts")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
