"""Echo: reply with digits, ideally the prompt's own. A task a tiny random model measurably learns on CPU.

Run it as `python environments/echo.py serve --config RUN.yaml` (atroposlib CLI).

The score of a reply mixes an unconditional part (the share of its first `reply_tokens` characters that are
digits), which a tiny model learns within a few dozen GRPO steps, with a conditional part (digits echoed in
the right position), which keeps scores varying inside a group long after the first part is solved.
"""

from __future__ import annotations

import random
from typing import Any

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from pydantic import Field

from rlctl.environment_kit.sampling import sample_group, scored_group
from rlctl.environment_kit.servers import local_model_server, tiny_model_dir

DIGITS = "0123456789"


def score_reply(reply: str, target: str, reply_tokens: int, digit_weight: float) -> float:
    """Weighted share of digits in the reply's first `reply_tokens` characters plus share of digits echoed."""
    head = reply.strip()[:reply_tokens]
    digit_share = sum(c in DIGITS for c in head) / reply_tokens
    echoed = sum(1 for produced, wanted in zip(head, target, strict=False) if produced == wanted)
    return digit_weight * digit_share + (1.0 - digit_weight) * echoed / len(target)


def score_completion(completion: str, gold: str) -> float:
    """The echo score of a reply to the prompt whose digits are `gold`, with the default window and weight: this
    makes `echo` a reward for dataset scoring and online dataset runs (docs/ENVIRONMENTS.md#scorers)."""
    defaults = EchoConfig.model_fields
    return score_reply(completion, gold, defaults["reply_tokens"].default, defaults["digit_weight"].default)


class EchoConfig(BaseEnvConfig):
    digits: int = Field(4, ge=1, le=32, description="Digits in each prompt, to be echoed back.")
    reply_tokens: int = Field(8, ge=1, le=256, description="Most tokens a reply may have; the score window.")
    digit_weight: float = Field(0.75, ge=0.0, le=1.0, description="Weight of the digit share in the score.")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="Sampling temperature of rollouts.")
    eval_items: int = Field(8, ge=0, description="Prompts per evaluation, sampled greedily (0: no evaluation).")
    seed: int = Field(0, description="Seed of the prompt stream.")


class EchoEnv(BaseEnv):
    """Echo digits back: a small task that a tiny random model learns from scratch on CPU within minutes."""

    name = "echo"
    env_config_cls = EchoConfig

    def __init__(self, config: EchoConfig, server_configs: Any, slurm: bool = False, testing: bool = False):
        super().__init__(config, server_configs, slurm, testing)
        self.config: EchoConfig = config
        self.prompts = random.Random(config.seed)
        self.recent_scores: list[float] = []
        self.eval_metrics: list[tuple[str, float]] = []

    @classmethod
    def config_init(cls) -> tuple[EchoConfig, list[APIServerConfig]]:
        tokenizer = tiny_model_dir()
        config = EchoConfig(
            tokenizer_name=tokenizer,
            group_size=8,
            batch_size=32,
            total_steps=60,
            steps_per_eval=20,
            max_token_length=512,
            use_wandb=False,
            wandb_name="echo",
            # A solved group (all scores equal) still goes to the trainer, which skips it; dropping it here
            # would starve a run of batches once the policy is good.
            ensure_scores_are_not_same=False,
        )
        return config, [local_model_server(tokenizer)]

    async def setup(self) -> None:
        """Prompts are generated on the fly; nothing to load."""

    def new_target(self) -> str:
        return "".join(self.prompts.choice(DIGITS) for _ in range(self.config.digits))

    @staticmethod
    def prompt_messages(target: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"Echo: {target}"}]

    async def get_next_item(self) -> dict[str, str]:
        return {"target": self.new_target()}

    def score(self, reply: str, target: str) -> float:
        return score_reply(reply, target, self.config.reply_tokens, self.config.digit_weight)

    async def collect_trajectories(self, item: dict[str, str]) -> tuple[ScoredDataGroup | None, list]:
        messages = self.prompt_messages(item["target"])
        samples = await sample_group(
            self,
            messages,
            n=self.config.group_size,
            max_tokens=self.config.reply_tokens,
            temperature=self.config.temperature,
        )
        scores = [self.score(text, item["target"]) for text, *_ in samples]
        self.recent_scores.extend(scores)
        return scored_group(messages, samples, scores), []

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        """Greedy replies to fresh prompts; eval/percent_correct is the mean score."""
        if self.config.eval_items == 0:
            return
        evaluation = random.Random(self.config.seed + 1)
        total = 0.0
        for _ in range(self.config.eval_items):
            target = "".join(evaluation.choice(DIGITS) for _ in range(self.config.digits))
            completion = await self.server.chat_completion(
                messages=self.prompt_messages(target),
                n=1,
                max_tokens=self.config.reply_tokens,
                temperature=0.0,
                split="eval",
            )
            total += self.score(completion.choices[0].message.content or "", target)
        self.eval_metrics.append(("eval/percent_correct", total / self.config.eval_items))

    async def wandb_log(self, wandb_metrics: dict | None = None) -> None:
        wandb_metrics = dict(wandb_metrics or {})
        if self.recent_scores:
            wandb_metrics["train/percent_correct"] = sum(self.recent_scores) / len(self.recent_scores)
            self.recent_scores = []
        wandb_metrics.update(self.eval_metrics)
        self.eval_metrics = []
        await super().wandb_log(wandb_metrics)


if __name__ == "__main__":
    EchoEnv.cli()
