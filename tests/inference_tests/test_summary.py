"""The pure parts of an inference test's report: percentiles, per-model results, the summary, file names."""

from __future__ import annotations

import pytest

from rlctl.service.inference_tests.summary import (
    ModelOutcome,
    model_result,
    percentile,
    progress_done,
    result_file_stem,
    summarize,
)


def test_percentiles_interpolate_between_ranks() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 95) == 3.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([float(x) for x in range(1, 101)], 95) == pytest.approx(95.05)
    assert percentile([1.0, 2.0], 100) == 2.0 and percentile([1.0, 2.0], 0) == 1.0


def test_file_names_replace_slashes_in_model_ids() -> None:
    assert result_file_stem("gsm8k", "qwen/qwen3-8b") == "test_gsm8k_qwen_qwen3-8b"
    assert result_file_stem("echo", "org/sub/model:free") == "test_echo_org_sub_model:free"


def test_model_result_counts_correct_as_score_above_zero() -> None:
    steps = [
        {"step": 1, "scores": [0.0, 1.0, 0.5, 0.0], "latencies_s": [0.2, 0.2, 0.2, 0.2]},
        {"step": 2, "scores": [0.0, 0.0, 0.0, -1.0], "latencies_s": [0.4, 0.4, 0.4, 0.4]},
        {"step": 3, "scores": [1.0, 1.0, 1.0, 1.0], "latencies_s": [1.0, 1.0, 1.0, 1.0]},
    ]
    result = model_result(ModelOutcome("a/b", steps=steps, wall_time_s=3.21))
    assert result.status == "succeeded" and result.error is None
    assert [s.correct for s in result.steps] == [2, 0, 4]
    assert result.steps_tested == 3 and result.total_completions == 12 and result.correct_completions == 6
    assert result.accuracy == 0.5
    assert result.steps_with_correct == 2 and result.step_success_rate == 0.6667
    assert result.latency.model_dump() == {"p50_s": 0.4, "p95_s": 1.0, "mean_s": 0.5333, "completions_timed": 12}


def test_a_model_with_an_error_or_without_completions_failed() -> None:
    partial = model_result(ModelOutcome("m", steps=[{"step": 1, "scores": [1.0]}], error="timed out"))
    assert partial.status == "failed" and partial.steps_tested == 1 and partial.accuracy == 1.0
    empty = model_result(ModelOutcome("m"))
    assert empty.status == "failed" and "no completion" in empty.error
    assert empty.latency.p50_s is None and empty.step_success_rate == 0.0


def test_summary_picks_the_best_succeeded_model_and_averages_only_those() -> None:
    results = [
        model_result(ModelOutcome("first", steps=[{"step": 1, "scores": [1.0, 0.0]}])),
        model_result(ModelOutcome("broken", steps=[{"step": 1, "scores": [1.0, 1.0]}], error="404")),
        model_result(ModelOutcome("second", steps=[{"step": 1, "scores": [1.0, 0.0]}])),
        model_result(ModelOutcome("worst", steps=[{"step": 1, "scores": [0.0, 0.0]}])),
    ]
    summary = summarize(results, steps_requested=1, output_directory="/out")
    assert summary.model_dump() == {
        "steps_requested": 1,
        "models_tested": 4,
        "models_succeeded": 3,
        "best_model": "first",  # ties go to the first in request order; the failed one never counts
        "avg_accuracy": round((0.5 + 0.5 + 0.0) / 3, 4),
        "environment_working": True,
        "output_directory": "/out",
    }
    nothing = summarize([results[1]], 1, "/out")
    assert nothing.best_model is None and nothing.avg_accuracy is None and not nothing.environment_working


def test_progress_counts_the_rest_of_ended_models_as_done() -> None:
    assert progress_done({"a": 1, "b": 0}, set(), 3) == 1
    assert progress_done({"a": 1, "b": 0}, {"b"}, 3) == 4
    assert progress_done({"a": 5}, set(), 3) == 3
