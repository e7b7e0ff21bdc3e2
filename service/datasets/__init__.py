"""Trajectory datasets as a service: storage, uploads, routes, and the jobs that derive datasets. The pure
logic they build on (formats, conversion, stats, filters, compression, rewards, GRPO grouping) is the top-level
package `trajectories/`. See docs/DATASETS.md.
"""
