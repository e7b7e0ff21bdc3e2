"""Training runs: configuration, lifecycle, supervision, status, results."""
