"""The GRPO loop: pull a batch from Atropos, train on it, publish the weights, record metrics, checkpoint."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from rlctl.trainer.atropos import AtroposClient, NotRegistered, Registration
from rlctl.trainer.backends import make_backend
from rlctl.trainer.backends.base import Checkpoint, TrainingBackend
from rlctl.trainer.config import TrainerConfig
from rlctl.trainer.failures import COLLAPSED, SAMPLING_FAILED, TRAINING_FAILED, FailureBudget, TrainingHalted
from rlctl.trainer.grpo import PolicyLoss, prepare_batch, step_metrics
from rlctl.trainer.health import Collapse, RunHealth, best_checkpoint
from rlctl.trainer.inference_guard import KEY_ENV as INFERENCE_KEY_ENV
from rlctl.trainer.inference_server import InferenceServer, create_app
from rlctl.trainer.outputs import MetricsWriter, TrainerState, TrainerStateStore, WandbMirror
from rlctl.trainer.retention import prune

log = logging.getLogger("trainer")

API_START_TIMEOUT_S = 120.0
API_UNREACHABLE_TIMEOUT_S = 300.0


@dataclass
class StepTimings:
    wait_for_batch_s: float = 0.0
    datum_build_s: float = 0.0
    forward_backward_s: float = 0.0
    optimizer_s: float = 0.0
    publish_s: float = 0.0

    @property
    def step_s(self) -> float:
        """Time spent on the step itself, not waiting for its batch."""
        return self.datum_build_s + self.forward_backward_s + self.optimizer_s + self.publish_s

    def as_metrics(self) -> dict[str, float]:
        return {
            "time/step_s": self.step_s,
            "time/wait_for_batch_s": self.wait_for_batch_s,
            "time/datum_build_s": self.datum_build_s,
            "time/forward_backward_s": self.forward_backward_s,
            "time/optimizer_s": self.optimizer_s,
            "time/publish_s": self.publish_s,
        }


@dataclass(frozen=True)
class BatchOptions:
    """A run's choices of how a batch becomes datums and what its metrics compare against."""

    normalization: str | None = None  # None: from normalize_advantages
    mask_truncated: bool = False
    loss: PolicyLoss | None = None

    @classmethod
    def of(cls, config: TrainerConfig) -> BatchOptions:
        return cls(config.advantage_normalization, config.mask_truncated_completions, config.loss)


@dataclass
class StepReport:
    metrics: dict[str, float]
    timings: StepTimings = field(default_factory=StepTimings)


def train_on_batch(
    backend: TrainingBackend,
    groups: Sequence[dict[str, Any]],
    step: int,
    learning_rate: float,
    max_length: int,
    timings: StepTimings,
    normalize_advantages: bool = False,
    options: BatchOptions | None = None,
) -> StepReport:
    """One GRPO step on one Atropos batch; `step` is the number the published weights get."""
    started = time.perf_counter()
    options = options or BatchOptions()
    batch = prepare_batch(
        groups,
        max_length,
        normalize_advantages,
        normalization=options.normalization,
        mask_truncated=options.mask_truncated,
        stop_ids=getattr(backend, "stop_token_ids", frozenset()),
    )
    missing = [index for index, datum in enumerate(batch.data) if datum.sampler_logprobs is None]
    if missing:  # the environment sent no sampler logprobs: score the rollouts with the current weights
        computed = backend.compute_logprobs([batch.data[index] for index in missing])
        for index, logprobs in zip(missing, computed, strict=True):
            batch.data[index] = batch.data[index].with_sampler_logprobs(logprobs)
    timings.datum_build_s = time.perf_counter() - started
    training_logprobs: list[list[float]] = []
    loss_sum = 0.0
    token_stats: dict[str, float] = {}
    if batch.data:
        outcome = backend.train_step(batch.data, learning_rate, step)
        training_logprobs, loss_sum = outcome.result.logprobs, outcome.result.loss_sum
        token_stats = outcome.result.token_stats
        timings.forward_backward_s = outcome.forward_backward_s
        timings.optimizer_s = outcome.optimizer_s
        timings.publish_s = outcome.publish_s
    else:  # nothing to train on: the weights keep their values under the new version
        started = time.perf_counter()
        backend.publish_weights(step)
        timings.publish_s = time.perf_counter() - started
    metrics = step_metrics(batch, training_logprobs, loss_sum, learning_rate, options.loss, token_stats)
    tokens = sum(len(datum.input_tokens) for datum in batch.data)
    metrics.update(timings.as_metrics())
    metrics["throughput/tokens_per_s"] = tokens / timings.step_s if timings.step_s > 0 else 0.0
    metrics["weights/version"] = float(step)
    return StepReport(metrics=metrics, timings=timings)


def environment_groups(groups: Sequence[dict[str, Any]], environments: int) -> dict[str, float]:
    """A mixed run's groups of this batch per environment, by the id the trajectory API gave each as it
    registered (docs/RUNS.md#mixed-environments); nothing for a run of one environment."""
    if environments < 2:
        return {}
    counts = dict.fromkeys(range(environments), 0)
    for group in groups:
        env_id = group.get("env_id")
        if isinstance(env_id, int) and env_id in counts:
            counts[env_id] += 1
    return {f"batch/groups_env{env_id}": float(count) for env_id, count in counts.items()}


def split_cpu_threads() -> None:
    """The local backend trains and samples at the same time (docs/TRAINER.md#local-sampling): on the CPU each
    gets half the cores for its operators, instead of both fighting over all of them."""
    import torch

    if torch.get_num_threads() > 1:
        torch.set_num_threads(max(1, torch.get_num_threads() // 2))


class StopRequest:
    """Set by SIGTERM/SIGINT; waits wake up at once."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def install(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        log.info("received %s: finishing the current step, then stopping", signal.Signals(signum).name)
        self._event.set()

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def wait(self, seconds: float) -> bool:
        return self._event.wait(seconds)


class Trainer:
    def __init__(self, config: TrainerConfig, stop: StopRequest) -> None:
        self.config = config
        self.stop = stop
        self.state_store = TrainerStateStore(config.run_dir)
        self.state: TrainerState = self.state_store.load()
        self.metrics: MetricsWriter | None = None
        self.backend: TrainingBackend | None = None
        self.server: InferenceServer | None = None
        self.wandb = WandbMirror(None)
        self.atropos = AtroposClient(config.rollout_server_url)
        self.sampling_budget = FailureBudget(SAMPLING_FAILED, config.sampling_error_budget, "sampling calls")
        self.training_budget = FailureBudget(TRAINING_FAILED, config.training_error_budget, "training steps")
        self.health = RunHealth(config.health, self.state.health)

    # --- lifecycle ------------------------------------------------------------------------------

    def run(self) -> int:
        try:
            self._start()
            self._train()
            self._finish("stopped" if self.stop.requested else "completed")
            return 0
        except TrainingHalted as error:
            log.error("trainer failed: %s: %s", error.kind, error)
            self._fail(str(error), error.kind)
            return 1
        except Exception as error:
            log.exception("trainer failed")
            self._fail(f"{type(error).__name__}: {error}")
            return 1
        finally:
            self._shutdown()

    def _start(self) -> None:
        config = self.config
        resume_from = self.state.last_checkpoint()
        self.state.step = resume_from.step if resume_from else 0
        if resume_from is None and config.init_from:  # a warm start: the weights only, from step 0
            log.info("warm start from %s", config.init_from)
            resume_from = Checkpoint(step=0, path=config.init_from, weights=config.init_from, optimizer=False)
        self.state.total_steps, self.state.backend = config.total_steps, config.backend
        self.state.status, self.state.error, self.state.failure_kind = "running", None, None
        self.state_store.save(self.state)
        if resume_from and resume_from.optimizer:
            log.info("resuming from the checkpoint of step %d (%s)", resume_from.step, resume_from.path)
        if config.backend == "local":
            split_cpu_threads()
        self.backend = make_backend(config, resume_from)
        self.state.base_model = self.backend.model_name
        self.backend.publish_weights(self.state.step)
        short_names = (config.wandb_run_name, config.run_dir.name)  # the run's name and id (docs/TRAINER.md)
        app = create_app(
            self.backend,
            short_names,
            sampling_budget=self.sampling_budget,
            api_key=os.environ.get(INFERENCE_KEY_ENV),  # the run's launch made it (docs/SECURITY.md)
        )
        self.server = InferenceServer(app, config.inference_host, config.inference_port)
        self.server.start()
        self.metrics = MetricsWriter(config.run_dir)
        self._start_wandb()
        self._record_warnings()
        self.state_store.save(self.state)
        if self.atropos.wait_until_up(API_START_TIMEOUT_S, self.stop.wait):
            self._register()

    def _start_wandb(self) -> None:
        config = self.config
        run_config = {key: str(value) if isinstance(value, Path) else value for key, value in config.__dict__.items()}
        self.wandb = WandbMirror.start(
            config.wandb_project,
            config.wandb_run_name,
            config.wandb_group,
            config.run_dir,
            run_config,
            resume_id=self.state.wandb_run_id,
        )
        self.state.wandb_run_name = self.wandb.run_name
        self.state.wandb_url = self.wandb.run_url
        self.state.wandb_run_id = self.wandb.run_id
        warning = self.wandb.warning()
        if warning is not None and self.state.add_warning(warning):
            log.warning("%s", warning["message"])

    def _register(self) -> None:
        config = self.config
        registration = Registration(
            wandb_group=config.wandb_group,
            wandb_project=config.wandb_project,
            batch_size=config.batch_size,
            max_token_len=config.max_token_trainer_length,
            checkpoint_dir=str(config.checkpoints_dir),
            save_checkpoint_interval=config.save_checkpoint_interval,
            starting_step=self.state.step,
            num_steps=config.total_steps,
        )
        self.atropos.register(registration)
        log.info("registered with the Atropos API at %s from step %d", config.rollout_server_url, self.state.step)

    # --- training -------------------------------------------------------------------------------

    def _train(self) -> None:
        assert self.backend is not None and self.metrics is not None
        while self.state.step < self.config.total_steps and not self.stop.requested:
            timings = StepTimings()
            groups = self._wait_for_batch(timings)
            if groups is None:
                break
            step = self.state.step + 1
            report = self._train_step(groups, step, timings)
            if report is None:
                continue
            report.metrics.update(environment_groups(groups, self.config.mixed_environments))
            self.metrics.step(step, report.metrics)
            self.wandb.log(step, report.metrics)
            self.state.step = step
            self.state.waiting_for_rollouts_s = None
            collapse = self.health.observe(step, report.metrics)
            if step % self.config.save_checkpoint_interval == 0 or step == self.config.total_steps:
                self._checkpoint(step)
            if collapse is not None:
                self._flag_collapse(collapse)
            self._record_warnings()
            self.state.health = self.health.snapshot()
            self.state_store.save(self.state)
            if collapse is not None and self.config.health.stop_on_collapse:
                raise TrainingHalted(COLLAPSED, f"stopped on collapse: {collapse.describe()}")
            log.info(
                "step %d/%d reward/mean %.3f loss %.4f (%.2f s)",
                step,
                self.config.total_steps,
                report.metrics["reward/mean"],
                report.metrics["train/loss"],
                report.metrics["time/step_s"],
            )

    def _train_step(self, groups: list[dict[str, Any]], step: int, timings: StepTimings) -> StepReport | None:
        """One step, or None when it failed within the training budget (its batch is dropped, the gradients it
        may have accumulated discarded, and the next batch trained as the same step)."""
        assert self.backend is not None and self.metrics is not None
        try:
            report = train_on_batch(
                self.backend,
                groups,
                step,
                self.config.learning_rate,
                self.config.max_token_trainer_length,
                timings,
                self.config.normalize_advantages,
                BatchOptions.of(self.config),
            )
        except TrainingHalted:  # e.g. an unsupported batch: no retry could train it
            raise
        except Exception as error:  # noqa: BLE001 - counted against the budget, which decides
            log.warning("training step %d failed: %s: %s", step, type(error).__name__, error)
            self.training_budget.failure(error)
            self.metrics.event(self.state.step, "training_failed", error=f"{type(error).__name__}: {error}")
            self.training_budget.check()
            self.backend.discard_gradients()
            return None
        self.training_budget.success()
        return report

    def _wait_for_batch(self, timings: StepTimings) -> list[dict[str, Any]] | None:
        """The next batch, or None when a stop was requested first. Long waits go to the log and metrics."""
        started = time.monotonic()
        next_report = started + self.config.waiting_report_interval_s
        unreachable_since: float | None = None
        while not self.stop.requested:
            self.sampling_budget.check()  # rollouts cannot come while every sample fails: fail now, not stall
            try:
                groups = self.atropos.get_batch()
                unreachable_since = None
            except NotRegistered:
                log.warning("the Atropos API lost this trainer's registration; registering again")
                self._register()
                continue
            except httpx.HTTPError as error:
                unreachable_since = unreachable_since or time.monotonic()
                if time.monotonic() - unreachable_since > API_UNREACHABLE_TIMEOUT_S:
                    raise RuntimeError(f"the Atropos API has been unreachable for too long: {error}") from error
                groups = None
                if isinstance(error, httpx.HTTPStatusError) and error.response.status_code >= 500:
                    # After /reset_data the API answers 500 until the trainer registers again.
                    log.warning("the Atropos API failed to form a batch (%s); registering again", error)
                    with contextlib.suppress(httpx.HTTPError):
                        self._register()
            if groups:
                timings.wait_for_batch_s = time.monotonic() - started
                return groups
            now = time.monotonic()
            if now >= next_report:
                self._report_waiting(now - started)
                next_report = now + self.config.waiting_report_interval_s
            self.stop.wait(self.config.batch_poll_interval_s)
        return None

    def _report_waiting(self, waited_s: float) -> None:
        assert self.metrics is not None
        log.info(
            "waiting for rollouts: no batch from the Atropos API for %.0f s (step %d/%d)",
            waited_s,
            self.state.step,
            self.config.total_steps,
        )
        self.metrics.waiting_for_rollouts(self.state.step, waited_s)
        self.state.waiting_for_rollouts_s = round(waited_s, 3)
        self.state_store.save(self.state)

    def _record_warnings(self) -> None:
        """Backend and W&B warnings go to the log, metrics.jsonl and trainer_state.json's `warnings` (the run's
        status)."""
        assert self.backend is not None and self.metrics is not None
        records = [warning.as_record() for warning in self.backend.drain_warnings()]
        records += [record for record in (self.wandb.log_warning(),) if record is not None]
        for record in records:
            if self.state.add_warning(record):
                log.warning("%s", record["message"])
                self.metrics.warning(self.state.step, record)

    def _flag_collapse(self, collapse: Collapse) -> None:
        assert self.metrics is not None
        log.warning("the run collapsed: %s", collapse.describe())
        self.state.collapse = asdict(collapse)
        self.metrics.event(self.state.step, "collapse", collapse=asdict(collapse))

    def _checkpoint(self, step: int) -> None:
        assert self.backend is not None
        checkpoint = self.backend.save_checkpoint(step)
        self.state.add_checkpoint(checkpoint, self.health.checkpoint_value())
        self.state.best_checkpoint = best_checkpoint(self.state.checkpoints)
        log.info("checkpoint of step %d saved to %s", step, checkpoint.path)
        if self.config.keep_last_n is not None:
            self._retain(self.config.keep_last_n)

    def _retain(self, keep_last_n: int) -> None:
        """Delete the checkpoints retention does not keep (docs/TRAINER.md#retention)."""
        best = (self.state.best_checkpoint or {}).get("step")
        deleted = set(prune(self.config.run_dir, self.state.checkpoints, keep_last_n, best))
        if deleted:
            self.state.checkpoints = [entry for entry in self.state.checkpoints if entry["step"] not in deleted]
            log.info("retention deleted the checkpoints of steps %s", sorted(deleted))

    def _finish(self, status: str) -> None:
        last = self.state.last_checkpoint()
        if self.state.step > 0 and (last is None or last.step < self.state.step):
            self._checkpoint(self.state.step)
        self._record_warnings()
        self.state.status = status
        self.state.waiting_for_rollouts_s = None
        self.state_store.save(self.state)
        log.info("trainer %s at step %d/%d", status, self.state.step, self.config.total_steps)

    def _fail(self, message: str, kind: str | None = None) -> None:
        self.state.status, self.state.error, self.state.failure_kind = "failed", message, kind
        self.state_store.save(self.state)

    def _shutdown(self) -> None:
        self.wandb.finish(0 if self.state.status in ("completed", "stopped") else 1)
        if self.server is not None:
            self.server.stop()
        if self.backend is not None:
            self.backend.close()
        if self.metrics is not None:
            self.metrics.close()
        self.atropos.close()
