"""A small web page over the public HTTP API: runs, one run's curves, processes and logs, datasets."""
