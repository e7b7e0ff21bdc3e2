"""Trajectory datasets. The pure logic (import, convert, stats, filter, compress, score, export records) does no
I/O beyond what the caller hands in (lines, records) and is exported here; the service modules beside it
(`routes`, `service`, `operations`, `store`, `builder`, `uploads`, `tokenizers`, `env_scorer`) build on it one
record at a time. See docs/DATASETS.md.
"""

from service.datasets.compression import (
    CompressionConfig,
    CompressionMetrics,
    CompressionResult,
    CompressionStats,
    compress_record,
)
from service.datasets.filters import FilterCriteria, FilterReport, drop_reasons
from service.datasets.grpo import GroupIssue, GrpoExportStats, GrpoGroup, group_key, grpo_groups
from service.datasets.importing import FORMAT_NAMES, ImportedRecord, detect_format, import_item, import_lines
from service.datasets.reading import ItemError, RawItem, read_items
from service.datasets.records import ToolCall, TrajectoryRecord, Turn, record_from_dict, record_to_dict
from service.datasets.rewards import (
    CorrectnessReward,
    EnvironmentScorer,
    FormatReward,
    RewardFunction,
    RewardResult,
    SourceReward,
    WeightedReward,
    build_rewards,
    score_record,
    scored,
)
from service.datasets.stats import DatasetStats, RecordStats, compute_record_stats
from service.datasets.summarizers import (
    ExtractiveSummarizer,
    OpenAICompatibleSummarizer,
    SummarizationError,
    Summarizer,
)
from service.datasets.tokens import ApproximateTokenCounter, HuggingFaceTokenCounter, TokenCounter

__all__ = [
    "FORMAT_NAMES",
    "ApproximateTokenCounter",
    "CompressionConfig",
    "CompressionMetrics",
    "CompressionResult",
    "CompressionStats",
    "CorrectnessReward",
    "EnvironmentScorer",
    "FormatReward",
    "RewardFunction",
    "SourceReward",
    "DatasetStats",
    "ExtractiveSummarizer",
    "FilterCriteria",
    "FilterReport",
    "GroupIssue",
    "GrpoExportStats",
    "GrpoGroup",
    "HuggingFaceTokenCounter",
    "ImportedRecord",
    "ItemError",
    "OpenAICompatibleSummarizer",
    "RawItem",
    "RecordStats",
    "RewardResult",
    "SummarizationError",
    "Summarizer",
    "TokenCounter",
    "ToolCall",
    "TrajectoryRecord",
    "Turn",
    "WeightedReward",
    "build_rewards",
    "compress_record",
    "compute_record_stats",
    "detect_format",
    "drop_reasons",
    "group_key",
    "grpo_groups",
    "import_item",
    "import_lines",
    "read_items",
    "record_from_dict",
    "record_to_dict",
    "score_record",
    "scored",
]
