"""GSM8K: grade-school math word problems, reward 1.0 for a correct final answer.

Run it as `python environments/gsm8k.py serve --config RUN.yaml` (atroposlib CLI). The data set comes from
the directory in `RLCTL_GSM8K_PATH` (GSM8K's `train.jsonl` and `test.jsonl`) when set, otherwise from the
Hugging Face hub (`openai/gsm8k`, config `main`).
"""

from __future__ import annotations

import json
import os
import random
import re
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from pydantic import Field

from rlctl.environment_kit.sampling import sample_group, scored_group
from rlctl.environment_kit.servers import local_model_server

SYSTEM_PROMPT = (
    "You are a careful math tutor. Solve the problem step by step, then give the final answer as a number "
    "inside \\boxed{}, for example \\boxed{42}."
)
_BOXED = re.compile(r"\\boxed\s*\{")
_HASHES = re.compile(r"####\s*([^\n]+)")
# Written so no two repeats can share a run of white space: backtracking over a long run stays linear.
_ANSWER_IS = re.compile(r"answer\s*(?:is|:)[\s*]*([-$\d.,/ ]+)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def gold_answer(solution: str) -> str | None:
    """The reference answer: what follows `####` in a GSM8K solution."""
    match = _HASHES.search(solution)
    return normalize_number(match.group(1)) if match else None


def extract_answer(completion: str) -> str | None:
    """The model's final answer: the last \\boxed{}, else `#### N`, else "the answer is N", else the last number.

    Reasoning inside a closed <think> block is ignored; an unclosed one means no answer yet.
    """
    text = _without_think_blocks(completion)
    if "<think>" in text:
        return None
    for candidate in (_last_boxed(text), _last_match(_HASHES, text), _last_match(_ANSWER_IS, text)):
        if candidate is not None and (number := normalize_number(candidate)) is not None:
            return number
    numbers = _NUMBER.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


def normalize_number(text: str) -> str | None:
    """`$1,234.50` → `1234.5`; `3/4` → `0.75`; anything without a number → None."""
    cleaned = text.strip().replace(",", "").replace("$", "").replace("%", "").rstrip(".").strip()
    cleaned = re.sub(r"\\text\{[^{}]*\}|\\!|\s+", "", cleaned)
    if "/" in cleaned:
        numerator, _, denominator = cleaned.partition("/")
        try:
            value = Decimal(numerator) / Decimal(denominator)
        except (InvalidOperation, ZeroDivisionError):
            return None
    else:
        match = _NUMBER.search(cleaned)
        if not match:
            return None
        try:
            value = Decimal(match.group(0).replace("$", "").replace(",", ""))
        except InvalidOperation:
            return None
    normalized = format(value.normalize(), "f")
    return normalized.rstrip("0").rstrip(".") if "." in normalized else normalized


def score_completion(completion: str, gold: str | None) -> float:
    predicted = extract_answer(completion)
    return 1.0 if gold is not None and predicted is not None and predicted == gold else 0.0


def _without_think_blocks(text: str) -> str:
    """Closed <think>…</think> blocks replaced by a space, in one pass (a lazy regular expression took quadratic
    time on a completion of many unclosed <think>)."""
    pieces, position = [], 0
    while (start := text.find("<think>", position)) >= 0:
        end = text.find("</think>", start + 7)
        if end < 0:
            break
        pieces += [text[position:start], " "]
        position = end + 8
    pieces.append(text[position:])
    return "".join(pieces)


def _last_boxed(text: str) -> str | None:
    """Contents of the last \\boxed{...}, with nested braces."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    depth, start = 1, starts[-1]
    for index in range(start, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return text[start:index]
    return None


def _last_match(pattern: re.Pattern[str], text: str) -> str | None:
    matches = pattern.findall(text)
    return matches[-1] if matches else None


def load_split(split: str) -> list[dict[str, str]]:
    """GSM8K rows ({question, answer}) from RLCTL_GSM8K_PATH, else from the Hugging Face hub."""
    directory = os.environ.get("RLCTL_GSM8K_PATH")
    if directory:
        path = Path(directory) / f"{split}.jsonl"
        with path.open(encoding="utf-8") as lines:
            return [json.loads(line) for line in lines if line.strip()]
    from datasets import load_dataset

    return [dict(row) for row in load_dataset("openai/gsm8k", "main", split=split)]


class GSM8KConfig(BaseEnvConfig):
    max_new_tokens: int = Field(1024, ge=1, description="Most tokens a completion may have.")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="Sampling temperature of rollouts.")
    eval_items: int = Field(200, ge=0, description="Test problems per evaluation (0 turns evaluation off).")
    system_prompt: str = Field(SYSTEM_PROMPT, description="System message sent before each problem.")


class GSM8KEnv(BaseEnv):
    """Grade-school math word problems (GSM8K), reward 1.0 for a correct final answer."""

    name = "gsm8k"
    env_config_cls = GSM8KConfig

    def __init__(self, config: GSM8KConfig, server_configs: Any, slurm: bool = False, testing: bool = False):
        super().__init__(config, server_configs, slurm, testing)
        self.config: GSM8KConfig = config
        self.train: list[dict[str, str]] = []
        self.test: list[dict[str, str]] = []
        self.cursor = 0
        self.recent_scores: list[float] = []
        self.eval_metrics: list[tuple[str, float]] = []

    @classmethod
    def config_init(cls) -> tuple[GSM8KConfig, list[APIServerConfig]]:
        config = GSM8KConfig(
            tokenizer_name="Qwen/Qwen3-8B",
            group_size=16,
            batch_size=128,
            total_steps=2500,
            steps_per_eval=25,
            max_token_length=8192,
            use_wandb=False,
            wandb_name="gsm8k",
        )
        return config, [local_model_server("Qwen/Qwen3-8B")]

    async def setup(self) -> None:
        self.train = load_split("train")
        self.test = load_split("test")
        random.Random(0).shuffle(self.train)

    async def get_next_item(self) -> dict[str, str]:
        row = self.train[self.cursor % len(self.train)]
        self.cursor += 1
        return {"question": row["question"], "gold": gold_answer(row["answer"]) or ""}

    def prompt_messages(self, question: str) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": self.config.system_prompt},
            {"role": "user", "content": question},
        ]

    async def collect_trajectories(self, item: dict[str, str]) -> tuple[ScoredDataGroup | None, list]:
        messages = self.prompt_messages(item["question"])
        samples = await sample_group(
            self,
            messages,
            n=self.config.group_size,
            max_tokens=min(self.config.max_new_tokens, self.config.max_token_length),
            temperature=self.config.temperature,
        )
        scores = [score_completion(text, item["gold"]) for text, *_ in samples]
        self.recent_scores.extend(scores)
        return scored_group(messages, samples, scores), []

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        problems = self.test[: self.config.eval_items]
        if not problems:
            return
        correct = 0.0
        for row in problems:
            completion = await self.server.chat_completion(
                messages=self.prompt_messages(row["question"]),
                n=1,
                max_tokens=min(self.config.max_new_tokens, self.config.max_token_length),
                temperature=0.0,
                split="eval",
            )
            correct += score_completion(completion.choices[0].message.content or "", gold_answer(row["answer"]))
        self.eval_metrics.append(("eval/percent_correct", correct / len(problems)))

    async def wandb_log(self, wandb_metrics: dict | None = None) -> None:
        wandb_metrics = dict(wandb_metrics or {})
        if self.recent_scores:
            wandb_metrics["train/percent_correct"] = sum(self.recent_scores) / len(self.recent_scores)
            self.recent_scores = []
        for name, value in self.eval_metrics:
            wandb_metrics[name] = value
        self.eval_metrics = []
        await super().wandb_log(wandb_metrics)


if __name__ == "__main__":
    GSM8KEnv.cli()
