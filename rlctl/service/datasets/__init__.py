"""Trajectory datasets as a service: storage, uploads, routes, and the jobs that derive datasets. The pure
logic they build on (formats, conversion, stats, filters, compression, rewards, GRPO grouping) is the top-level
package `rlctl/trajectories/` (docs/TRAJECTORIES.md). See docs/DATASETS.md.
"""
