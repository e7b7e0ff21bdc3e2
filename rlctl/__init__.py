"""rlctl: the control plane (service), process supervision (supervisor), the trainer, pure trajectory logic
(trajectories), the judge (judging), OS isolation (sandbox) and the environments' shared helpers
(environment_kit), one namespace (docs/ARCHITECTURE.md#packages-and-import-rules)."""
