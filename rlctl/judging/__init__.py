"""The judge model over the network: the retried chat call, the judge client, its content cache and the group
decision, shared by the service's rewards (`rlctl/service/rewards/`) and the online dataset environment
(`environments/dataset_online.py`), which may not import `rlctl/service/` (docs/ARCHITECTURE.md). No database: the
service gives the cache its store. The prompt and the parsing of the answer are pure, in `rlctl/trajectories/judge.py`.
"""
