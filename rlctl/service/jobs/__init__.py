"""Background jobs: long operations answered with 202 and a job to poll."""
