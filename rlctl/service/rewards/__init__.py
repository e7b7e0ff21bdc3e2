"""Rewards as a service: the wiring that dataset scoring, online dataset runs and evaluations share. It holds the
reward request models (`schemas.py`) and errors (`errors.py`), the check of a request's rewards (`service.py`),
the judge's endpoint and its verdict cache in the database (`judge.py`), the group rewards decided over a records
file's prompts (`group_rewards.py`, `grouping.py`), and environments' scorers in a child process (`scorers.py`,
`scorer_child.py`). The pure reward logic is `rlctl/trajectories/` (rewards, judge prompts, calibration) and the judge's
network client `rlctl/judging/` (docs/TRAJECTORIES.md#rewards).
"""
