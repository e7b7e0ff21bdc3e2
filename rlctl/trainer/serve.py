"""Serve a local model, or a run's checkpoint, with the trainer's OpenAI-compatible inference server:
`python -m rlctl.trainer.serve DIR [--adapter CHECKPOINT] [--host 127.0.0.1] [--port 8001] [--lora-rank 8]`
(`rlctl model serve`). DIR is the base model (a directory or cached hub id); CHECKPOINT a local checkpoint
directory (`runs/{id}/checkpoints/step_N`), whose LoRA adapter is applied. Collections and inference tests can
target it like any OpenAI-compatible endpoint (docs/TRAINER.md#serving-a-model)."""

from __future__ import annotations

import argparse
import signal
import tempfile
import threading

from rlctl.trainer.evaluate import backend_for
from rlctl.trainer.inference_server import InferenceServer, create_app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlctl.trainer.serve", description=__doc__)
    parser.add_argument("model")
    parser.add_argument("--adapter", help="a local checkpoint directory (runs/{id}/checkpoints/step_N)")
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
    with tempfile.TemporaryDirectory() as scratch:
        backend = backend_for(spec, args.adapter, scratch)
        server = InferenceServer(create_app(backend), args.host, args.port)
        server.start()
        print(f"serving {args.model}{' + ' + args.adapter if args.adapter else ''} at {server.address}/v1", flush=True)
        done.wait()
        server.stop()
        backend.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
