"""Inference tests: an environment's own prompts and scoring on completions from OpenAI-compatible endpoints."""
