"""Collections: the batch runner that runs an agent over prompts and turns its trajectories into a dataset."""
