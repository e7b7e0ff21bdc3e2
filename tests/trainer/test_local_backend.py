"""The local backend on the tiny model: sampling and training agree, the loss is the importance-sampling
loss with the ratio clipped (PPO), Adam moves the policy the way the advantages say, and checkpoints restore
exactly."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rlctl.trainer.backends.base import SamplingRequest
from rlctl.trainer.backends.local import LocalBackend
from rlctl.trainer.backends.sampler_process import ProcessSampler
from rlctl.trainer.config import TrainerConfig, parse_config
from rlctl.trainer.grpo import TrainingDatum, build_datum
from tests.support.waiting import wait_until


def make_config(tiny_model_dir: Path, run_dir: Path, **tinker: object) -> TrainerConfig:
    return parse_config(
        {
            "env": {"rollout_server_url": "http://127.0.0.1:1"},
            "tinker": {
                "backend": "local",
                "base_model": str(tiny_model_dir),
                "run_dir": str(run_dir),
                "inference_port": 1,
                "device": "cpu",
                **tinker,
            },
        }
    )


@pytest.fixture
def backend(tiny_model_dir: Path, tmp_path: Path) -> Iterator[LocalBackend]:
    backend = LocalBackend(make_config(tiny_model_dir, tmp_path / "run"))
    yield backend
    backend.close()


@pytest.fixture(params=["shared_prefix", "padded"])
def sampling(request: pytest.FixtureRequest, tiny_model_dir: Path, tmp_path: Path) -> Iterator[LocalBackend]:
    """A backend with each kind of the sampler's cache (docs/TRAINER.md#local-sampling): the tiny model's
    architecture gets the shared-prefix one; every other architecture the padded one."""
    shared_prefix = request.param == "shared_prefix"
    backend = LocalBackend(make_config(tiny_model_dir, tmp_path / "run"), shared_prefix=shared_prefix)
    assert backend._sampler.shared_prefix == shared_prefix
    yield backend
    backend.close()


def chat_prompt(backend: LocalBackend, content: str) -> list[int]:
    text = backend.tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    return backend.tokenizer.encode(text, add_special_tokens=False)


def prompt_tokens(backend: LocalBackend) -> list[int]:
    return chat_prompt(backend, "Echo: 42")


def datums_for(backend: LocalBackend, prompt: list[int], advantage: float, n: int = 4):
    completions = backend.sample(SamplingRequest(prompt, n=n, max_new_tokens=6, seed=7))
    data = [
        build_datum(
            prompt + c.tokens,
            [-100] * len(prompt) + c.tokens,
            advantage,
            [1.0] * len(prompt) + c.logprobs,
            1024,
        )
        for c in completions
    ]
    return completions, data


def assert_trainer_logprobs(backend: LocalBackend, prompt: list[int], completions: list) -> None:
    data = [
        build_datum(prompt + c.tokens, [-100] * len(prompt) + c.tokens, 1.0, [1.0] * len(prompt) + c.logprobs, 1024)
        for c in completions
    ]
    for completion, datum, row in zip(completions, data, backend.compute_logprobs(data), strict=True):
        trained = [v for v, t in zip(row, datum.completion_mask, strict=True) if t]
        assert trained == pytest.approx(completion.logprobs, abs=1e-4)


def test_sampler_logprobs_equal_the_trainers(sampling: LocalBackend) -> None:
    prompt = prompt_tokens(sampling)
    completions, _ = datums_for(sampling, prompt, advantage=1.0)
    assert len(completions) == 4 and all(1 <= len(c.tokens) <= 6 for c in completions)
    assert_trainer_logprobs(sampling, prompt, completions)


def test_finish_reason_is_real(sampling: LocalBackend) -> None:
    prompt = prompt_tokens(sampling)
    everything = tuple(range(len(sampling.tokenizer)))
    stopped = sampling.sample(SamplingRequest(prompt, n=2, max_new_tokens=5, stop_token_ids=everything))
    assert all(c.finish_reason == "stop" and len(c.tokens) == 1 for c in stopped)
    greedy = sampling.sample(SamplingRequest(prompt, n=1, max_new_tokens=3, temperature=0.0))[0]
    eos_ids = {sampling.tokenizer.eos_token_id}
    assert (greedy.finish_reason == "length") == (len(greedy.tokens) == 3 and greedy.tokens[-1] not in eos_ids)


def completion_mean(rows, datums) -> float:
    values = [v for row, d in zip(rows, datums, strict=True) for v, t in zip(row, d.completion_mask, strict=True) if t]
    return sum(values) / len(values)


@pytest.mark.parametrize("advantage", [0.75, -0.75])
def test_loss_is_importance_sampling_and_adam_follows_the_advantages(backend: LocalBackend, advantage: float) -> None:
    _, data = datums_for(backend, prompt_tokens(backend), advantage=advantage)
    result = backend.forward_backward(data)
    # On-policy the ratio is 1, so the loss is minus the sum of the advantages over completion tokens.
    expected = -sum(sum(d.advantages) for d in data)
    assert result.loss_sum == pytest.approx(expected, abs=1e-4)
    before = completion_mean(backend.compute_logprobs(data), data)
    backend.optim_step(0.05)
    after = completion_mean(backend.compute_logprobs(data), data)
    assert (after - before) * advantage > 0.05


def stale(data: list[TrainingDatum], gap: float) -> list[TrainingDatum]:
    """The same datums as if sampled by weights that found each completion token `gap` nats less likely."""
    return [
        d.with_sampler_logprobs(
            [v - gap if t else v for v, t in zip(d.sampler_logprobs, d.completion_mask, strict=True)]
        )
        for d in data
    ]


def test_ppo_stops_pushing_tokens_already_far_likelier_than_sampled(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The local default: a ratio above clip_high with a positive advantage gives no gradient (no overshoot)."""
    clipped = LocalBackend(make_config(tiny_model_dir, tmp_path / "ppo"))
    assert clipped._config.loss.name == "ppo"
    _, data = datums_for(clipped, prompt_tokens(clipped), advantage=1.0)
    clipped.close()  # sampled once: its sampling thread is not needed any more
    data = stale(data, gap=2.0)  # ratio e² ≈ 7.4 on every completion token
    result = clipped.forward_backward(data)
    assert result.loss_sum == pytest.approx(-1.2 * sum(sum(d.advantages) for d in data), abs=1e-4)
    before = clipped.compute_logprobs(data)
    clipped.optim_step(0.05)
    assert clipped.compute_logprobs(data) == before

    unclipped = LocalBackend(make_config(tiny_model_dir, tmp_path / "is", loss_fn="importance_sampling"))
    unclipped.forward_backward(data)
    start = completion_mean(unclipped.compute_logprobs(data), data)
    unclipped.optim_step(0.05)
    assert completion_mean(unclipped.compute_logprobs(data), data) > start + 0.05


def expected_token_stats(backend: LocalBackend, data: list[TrainingDatum]) -> tuple[float, float]:
    """(entropy, k3 KL to the base) per completion token, computed afresh: full logits, peft's own
    `disable_adapter()` for the reference."""
    completion = [d.completion_mask for d in data]
    with torch.no_grad():
        policy = backend.compute_logprobs(data)
        with backend.model.disable_adapter():
            reference = backend.compute_logprobs(data)
        entropies = []
        for datum, mask in zip(data, completion, strict=True):
            logits = backend.model(input_ids=torch.tensor([datum.input_tokens])).logits[0].float()
            logprobs = torch.log_softmax(logits, dim=-1)
            entropy = -(logprobs.exp() * logprobs).sum(dim=-1)
            entropies += [float(e) for e, t in zip(entropy, mask, strict=True) if t]
    kls = [
        float(torch.exp(torch.tensor(r - p)) - (r - p) - 1)
        for rows in zip(policy, reference, completion, strict=True)
        for p, r, t in zip(*rows, strict=True)
        if t
    ]
    return sum(entropies) / len(entropies), sum(kls) / len(kls)


def test_kl_to_the_reference_is_measured_every_tenth_step_without_a_penalty(
    backend: LocalBackend, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """docs/TRAINER.md#training-options: without `kl_coef`, `kl/reference` is a metric of steps 1, 11, 21, ...
    (its reference pass is a third of a step); with one, every step has it. Entropy, every step, over completion
    tokens."""
    _, data = datums_for(backend, prompt_tokens(backend), advantage=1.0)
    measured = []
    for step in range(1, 13):
        entropy, kl = expected_token_stats(backend, data)
        stats = backend.train_step(data, 0.02, step).result.token_stats
        assert stats["entropy_sum"] / stats["tokens"] == pytest.approx(entropy, rel=1e-4)
        if stats["kl_tokens"]:
            measured.append(step)
            assert stats["kl_tokens"] == stats["tokens"]
            assert stats["kl_sum"] / stats["kl_tokens"] == pytest.approx(kl, rel=1e-3, abs=1e-7)
    assert measured == [1, 11]
    assert kl > 1e-4  # by step 11 the policy has moved: the reference pass really ran with the adapter off

    penalised = LocalBackend(make_config(tiny_model_dir, tmp_path / "kl", kl_coef=0.1))
    try:
        for step in (1, 2):
            stats = penalised.train_step(data, 0.02, step).result.token_stats
            assert stats["kl_tokens"] == stats["tokens"] > 0
    finally:
        penalised.close()


def test_publishing_is_in_process_and_sampling_sees_the_new_weights(backend: LocalBackend) -> None:
    prompt = prompt_tokens(backend)
    _, data = datums_for(backend, prompt, advantage=1.0)
    base_weights = backend.model.get_base_model().model.embed_tokens.weight
    backend.forward_backward(data)
    backend.optim_step(0.05)
    published = backend.publish_weights(1)
    assert published.version == 1 and backend.published.version == 1
    assert backend.model.get_base_model().model.embed_tokens.weight is base_weights  # never reloaded
    completions, _ = datums_for(backend, prompt, advantage=1.0)
    assert_trainer_logprobs(backend, prompt, completions)


def test_checkpoint_restores_weights_and_optimizer(backend: LocalBackend, tiny_model_dir: Path) -> None:
    prompt = prompt_tokens(backend)
    _, data = datums_for(backend, prompt, advantage=1.0)
    backend.forward_backward(data)
    backend.optim_step(0.05)
    checkpoint = backend.save_checkpoint(3)
    assert Path(checkpoint.path).name == "step_3" and checkpoint.weights == checkpoint.path
    assert (Path(checkpoint.path) / "adapter_model.safetensors").exists()
    restored = LocalBackend(backend._config, resume_from=checkpoint)
    flat = [value for row in restored.compute_logprobs(data) for value in row]
    assert flat == pytest.approx([value for row in backend.compute_logprobs(data) for value in row], abs=1e-6)
    fresh = LocalBackend(backend._config)  # without the checkpoint: the untrained adapter differs
    assert [value for row in fresh.compute_logprobs(data) for value in row] != pytest.approx(flat, abs=1e-6)
    saved_state = backend._optimizer.state_dict()["state"]
    restored_state = restored._optimizer.state_dict()["state"]
    assert saved_state.keys() == restored_state.keys()
    first = next(iter(saved_state))
    assert torch.equal(saved_state[first]["exp_avg"], restored_state[first]["exp_avg"])


class InFlight:
    """A request sampled in a thread of its own: `done` once answered, then `completions` or `error`."""

    def __init__(self, backend: LocalBackend, request: SamplingRequest) -> None:
        self.request = request
        self.completions: list | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(backend,), daemon=True)
        self._thread.start()

    def _run(self, backend: LocalBackend) -> None:
        try:
            self.completions = backend.sample(self.request)
        except BaseException as error:  # noqa: BLE001 - the test reads it
            self.error = error
        finally:
            self.done.set()

    def wait(self, timeout: float = 300) -> None:
        self._thread.join(timeout)

    def result(self, timeout: float = 300) -> list:
        assert self.done.wait(timeout), "the request was never answered"
        assert self.error is None, self.error
        assert self.completions is not None
        return self.completions


@pytest.fixture
def in_flight(sampling: LocalBackend):
    """Starts requests in threads of their own; each has ended before the test's backend goes, even on failure."""
    started: list[InFlight] = []

    def start(request: SamplingRequest) -> InFlight:
        started.append(InFlight(sampling, request))
        return started[-1]

    yield start
    for request in started:
        request.wait()


def wait_for_batch(backend: LocalBackend, request: InFlight) -> None:
    """Until the sampler decodes a batch holding `request` (its turn-taking state, read for the test's timing)."""

    def holds_it() -> bool:
        batch = backend._sampler._batch
        return batch is not None and any(pending.request is request.request for pending in list(batch.requests))

    wait_until(holds_it, timeout=120, message="the long request's batch to start")


def test_concurrent_requests_of_different_prompts_are_batched_and_keep_exact_logprobs(
    sampling: LocalBackend, in_flight
) -> None:
    """Requests sampled together share one left-padded batch: each completion's logprobs are still the trainer's
    for that prompt alone, so the padding never leaks into another request's rows."""
    prompts = [chat_prompt(sampling, "Echo: " + "7" * length) for length in (1, 5, 12)]
    requests = [in_flight(SamplingRequest(prompt, n=3, max_new_tokens=5)) for prompt in prompts]
    for prompt, request in zip(prompts, requests, strict=True):
        completions = request.result()
        assert len(completions) == 3 and all(c.weights_version == 0 for c in completions)
        assert_trainer_logprobs(sampling, prompt, completions)


def test_requests_join_a_running_batch_and_are_answered_as_their_rows_end(sampling: LocalBackend, in_flight) -> None:
    """A request arriving while a long batch runs joins it at the next token, with a prompt longer than the batch's
    cache (the cache is padded) and one shorter (its rows are padded), and is answered while the long request is
    still sampling; every completion's logprobs are still the trainer's for its own prompt."""
    short, long = chat_prompt(sampling, "Echo: 1"), chat_prompt(sampling, "Echo: " + "7" * 300)
    running = in_flight(SamplingRequest(short, n=8, max_new_tokens=200))
    wait_for_batch(sampling, running)
    joining = [
        in_flight(SamplingRequest(long, n=2, max_new_tokens=3)),
        in_flight(SamplingRequest(short, n=3, max_new_tokens=4)),
    ]
    answered = [request.result() for request in joining]
    # Eight rows of 200 random tokens all ending within a few steps is vanishingly unlikely: still running means
    # the short requests joined the batch instead of waiting for it to end.
    assert not running.done.is_set()
    for prompt, completions, limit in zip((long, short), answered, (3, 4), strict=True):
        assert all(1 <= len(c.tokens) <= limit for c in completions)
        assert_trainer_logprobs(sampling, prompt, completions)
    long_running = running.result()
    assert len(long_running) == 8
    assert_trainer_logprobs(sampling, short, long_running)


def test_a_seeded_request_is_sampled_alone_whatever_else_is_running(sampling: LocalBackend, in_flight) -> None:
    prompt = chat_prompt(sampling, "Echo: 42")
    seeded = SamplingRequest(prompt, n=3, max_new_tokens=8, seed=11)
    alone = sampling.sample(seeded)
    running = in_flight(SamplingRequest(chat_prompt(sampling, "Echo: 9"), n=4, max_new_tokens=120))
    wait_for_batch(sampling, running)
    beside = in_flight(seeded).result()
    assert [c.tokens for c in beside] == [c.tokens for c in alone]
    for ours, theirs in zip(beside, alone, strict=True):
        assert ours.logprobs == pytest.approx(theirs.logprobs, abs=1e-5)
    running.result()


def test_no_request_joins_once_new_weights_are_staged(sampling: LocalBackend, in_flight) -> None:
    """A batch in flight finishes on the weights it began with; a request arriving after a publish waits for it and
    is sampled from the new weights."""
    prompt = prompt_tokens(sampling)
    _, data = datums_for(sampling, prompt, advantage=1.0)
    sampling.forward_backward(data)
    sampling.optim_step(0.05)
    running = in_flight(SamplingRequest(prompt, n=4, max_new_tokens=150))
    wait_for_batch(sampling, running)
    sampling.publish_weights(1)
    after = in_flight(SamplingRequest(prompt, n=2, max_new_tokens=4))
    fresh = after.result()
    assert running.done.is_set()  # it was answered first: the new request did not join it
    assert all(c.weights_version == 0 for c in running.result())
    assert all(c.weights_version == 1 for c in fresh)
    assert_trainer_logprobs(sampling, prompt, fresh)


def test_every_forward_pass_runs_on_the_sampler_thread(sampling: LocalBackend, in_flight) -> None:
    """Requests from many threads are sampled on one: torch's intra-op threads are a team per calling thread,
    and one warm team is what keeps a small model's steps fast (docs/TRAINER.md#local-sampling)."""
    threads: set[int] = set()
    sampling._sampler._model.register_forward_pre_hook(lambda *_: threads.add(threading.get_ident()))
    requests = [in_flight(SamplingRequest(prompt_tokens(sampling), n=2, max_new_tokens=6)) for _ in range(4)]
    for request in requests:
        request.result()
    callers = {request._thread.ident for request in requests}
    assert len(threads) == 1 and not threads & callers


def test_closing_fails_the_requests_not_answered_and_refuses_new_ones(sampling: LocalBackend, in_flight) -> None:
    """The sampling thread is held inside its first forward pass while the sampler closes: it ends after that
    step, and the request (4 rows of 50 tokens, one sampled) fails instead of waiting for ever."""
    sampler, entered, release = sampling._sampler, threading.Event(), threading.Event()

    def hold(*_: object) -> None:
        entered.set()
        release.wait(120)

    hook = sampler._model.register_forward_pre_hook(hold)
    running = in_flight(SamplingRequest(prompt_tokens(sampling), n=4, max_new_tokens=50))
    assert entered.wait(120)
    closing = threading.Thread(target=sampling.close)
    closing.start()
    wait_until(lambda: sampler._closed, timeout=60, message="the sampler to be closing")
    hook.remove()
    release.set()
    closing.join(120)
    assert not closing.is_alive() and running.done.wait(120)
    assert isinstance(running.error, RuntimeError) and "closed" in str(running.error)
    with pytest.raises(RuntimeError, match="closed"):
        sampling.sample(SamplingRequest(prompt_tokens(sampling), n=1, max_new_tokens=2))


@pytest.fixture
def processes(tiny_model_dir: Path, tmp_path: Path) -> Iterator[LocalBackend]:
    """A backend whose sampler runs in a process of its own (docs/TRAINER.md#local-sampling)."""
    backend = LocalBackend(make_config(tiny_model_dir, tmp_path / "process", sampler="process"))
    yield backend
    backend.close()


def test_the_process_sampler_samples_as_the_thread_sampler_and_follows_published_weights(
    backend: LocalBackend, processes: LocalBackend
) -> None:
    assert isinstance(processes._sampler, ProcessSampler) and processes._sampler._pid != os.getpid()
    prompt = prompt_tokens(processes)
    request = SamplingRequest(prompt, n=4, max_new_tokens=6, seed=11)
    ours, theirs = processes.sample(request), backend.sample(request)  # same seed, same weights: same samples
    assert [c.tokens for c in ours] == [c.tokens for c in theirs]
    for mine, other in zip(ours, theirs, strict=True):
        assert mine.logprobs == pytest.approx(other.logprobs, abs=1e-5)
    _, data = datums_for(processes, prompt, advantage=1.0)
    processes.forward_backward(data)
    processes.optim_step(0.05)
    processes.publish_weights(1)
    completions = processes.sample(SamplingRequest(prompt, n=4, max_new_tokens=6, seed=12))
    assert {c.weights_version for c in completions} == {1}
    assert_trainer_logprobs(processes, prompt, completions)  # sampled from the weights just trained


def test_requests_fail_when_the_sampling_process_dies(processes: LocalBackend) -> None:
    request = SamplingRequest(prompt_tokens(processes), n=1, max_new_tokens=2)
    assert len(processes.sample(request)) == 1
    os.kill(processes._sampler._pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match="sampling process"):
        processes.sample(request)
