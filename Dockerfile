# syntax=docker/dockerfile:1
# The rlctl service: dependencies are installed in a builder stage; the runtime stage is slim and non-root.
#   docker build -t rlctl .      (or: docker compose up, see docker-compose.yml)
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
# torch is pinned to its CPU build, which PyTorch's own index serves.
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
# Dependencies first, from pyproject.toml alone, so a code change does not reinstall them.
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt
COPY rlctl ./rlctl
COPY environments ./environments
COPY migrations ./migrations
# Editable: the service finds environments/ and migrations/ beside its package, as in a checkout.
RUN pip install --no-deps -e .

FROM ${PYTHON_IMAGE} AS runtime
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    RLCTL_DATA_DIR=/data \
    RLCTL_LOG_FORMAT=json \
    RLCTL_PROBE_PORT=8081
# bubblewrap: the sandbox of the collections' terminal tool (docs/SECURITY.md); util-linux (prlimit, setpriv,
# unshare) is part of every Debian image. The sandbox needs user namespaces, which Docker's default seccomp
# profile refuses: without them `terminal` is refused (409 SANDBOX_UNAVAILABLE), never run unsandboxed.
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 rlctl \
    && useradd --system --uid 10001 --gid rlctl --home-dir /data --shell /usr/sbin/nologin rlctl \
    && mkdir -p /data \
    && chown rlctl:rlctl /data
COPY --from=builder /opt/venv /opt/venv
COPY --from=builder /app /app
WORKDIR /app
USER rlctl
# The database (SQLite by default), runs, logs and local models.
VOLUME ["/data"]
EXPOSE 8080
# Healthy when ready: the database answers, its schema is current and the event loop turns (python: slim has no
# curl). Asked of the probe listener (RLCTL_PROBE_PORT, on loopback): on the API's port a check waits behind every
# request in flight, seconds under a burst of reads (docs/ARCHITECTURE.md#probes).
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8081/readyz', timeout=4)"]
# Migrations, then the service; `exec` makes it PID 1's process, so `docker stop` reaches it.
CMD ["sh", "-c", "rlctl db upgrade && exec rlctl serve --host 0.0.0.0 --port 8080"]
