"""What Atropos environments share: the local model server `config_init()` names and the sampling of a group of
rollouts (docs/ENVIRONMENTS.md#shared-helpers).

An installed package, not a file beside the environments: an environment runs from its own file, alone on a Ray
node (docs/RAY.md), and from the managed directory, where no sibling file is there to import.
"""
