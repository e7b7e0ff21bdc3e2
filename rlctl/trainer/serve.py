"""Serve a local model, or a run's checkpoint, with the trainer's OpenAI-compatible inference server:
`python -m rlctl.trainer.serve DIR [--adapter CHECKPOINT] [--name ID] [--host 127.0.0.1] [--port 8001]
[--lora-rank 8]` (`rlctl model serve`). DIR is the base model (a directory or cached hub id); CHECKPOINT a local
checkpoint directory (`runs/{id}/checkpoints/step_N`), whose LoRA adapter is applied. The model answers to a short
id first (ID, else `{run}/step-{N}` for a run's checkpoint), then to DIR. Collections and inference tests can
target it like any OpenAI-compatible endpoint (docs/TRAINER.md#serving-a-model)."""

from __future__ import annotations

import argparse
import contextlib
import re
import signal
import tempfile
import threading
from pathlib import Path

from rlctl.trainer.evaluate import backend_for
from rlctl.trainer.inference_server import InferenceServer, create_app
from rlctl.trainer.retention import leased

CHECKPOINT_DIR = re.compile(r"^step_(\d+)$")


def short_model_id(adapter: str | None, name: str | None) -> str | None:
    """The id a client names the served model by: `--name`, else `{run}/step-{N}` for a checkpoint directory laid
    out as a run keeps them (`runs/{run}/checkpoints/step_N`); None when neither applies."""
    if name:
        return name
    if adapter is None:
        return None
    path = Path(adapter).resolve()
    step = CHECKPOINT_DIR.match(path.name)
    if step is None or path.parent.name != "checkpoints":
        return None
    return f"{path.parent.parent.name}/step-{int(step.group(1))}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlctl.trainer.serve", description=__doc__)
    parser.add_argument("model")
    parser.add_argument("--adapter", help="a local checkpoint directory (runs/{id}/checkpoints/step_N)")
    parser.add_argument("--name", help="the model id to answer to (default: {run}/step-{N} for a checkpoint)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--lora-rank", type=int, default=8, help="when the checkpoint does not say")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)
    spec = {
        "base_model": args.model,
        "lora_rank": args.lora_rank,  # the checkpoint's own rank and alpha win (evaluate.adapter_shape)
        "device": args.device,
    }
    done = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: done.set())
    held = leased(Path(args.adapter), "serve") if args.adapter else contextlib.nullcontext()
    with held, tempfile.TemporaryDirectory() as scratch:  # the checkpoint stays while it is served (retention)
        backend = backend_for(spec, args.adapter, scratch)
        short = short_model_id(args.adapter, args.name)
        server = InferenceServer(create_app(backend, model_names=[short] if short else []), args.host, args.port)
        server.start()
        served = f"{args.model}{' + ' + args.adapter if args.adapter else ''}{f' as {short}' if short else ''}"
        print(f"serving {served} at {server.address}/v1", flush=True)
        done.wait()
        server.stop()
        backend.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
