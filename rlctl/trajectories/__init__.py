"""Pure trajectory logic: import formats, conversion to ShareGPT turns, stats, filters, compression, rewards and
GRPO grouping. No I/O beyond what the caller hands in (lines, records, a token counter, a summariser), and no
import from `rlctl/service/`, `rlctl/supervisor/` or `rlctl/trainer/` (docs/ARCHITECTURE.md). The rules are written in
docs/TRAJECTORIES.md.
"""
