"""Weights in and out of a run, on the tiny model: resume (a backend built from a checkpoint, optimiser state
included), the checkpoint archive's stream (GET /runs/{id}/checkpoints/{step}/archive) and the LoRA merge.

    .venv/bin/python benchmarks/weights_out.py [--repeat 5] [--archive-mb 256]

Each figure comes with its baseline measured in the same run: a backend built without a checkpoint, reading the
same files without the tar framing, loading the base model alone. The archive is streamed from a checkpoint whose
adapter file is padded to --archive-mb, so the rate is a rate and not a start-up cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlctl.service.runs.archive import CHUNK_BYTES, checkpoint_files, tar_stream  # noqa: E402
from rlctl.service.runs.paths import RunPaths  # noqa: E402
from rlctl.trainer.backends.base import Checkpoint  # noqa: E402
from rlctl.trainer.backends.local import LocalBackend  # noqa: E402
from rlctl.trainer.config import parse_config  # noqa: E402
from rlctl.trainer.merge import merge_adapter  # noqa: E402
from rlctl.trainer.tiny_model import init_tiny_model  # noqa: E402


def median_s(action: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def config(model: Path, run_dir: Path):  # type: ignore[no-untyped-def]
    tinker = {"backend": "local", "base_model": str(model), "run_dir": str(run_dir), "inference_port": 1}
    return parse_config({"env": {"rollout_server_url": "http://127.0.0.1:1"}, "tinker": {**tinker, "device": "cpu"}})


def built(model: Path, run_dir: Path, checkpoint: Checkpoint | None) -> None:
    LocalBackend(config(model, run_dir), checkpoint).close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--archive-mb", type=int, default=256)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        model = init_tiny_model(root / "tiny")
        paths = RunPaths(root / "var", "bench")
        backend = LocalBackend(config(model, paths.run_dir))
        checkpoint = backend.save_checkpoint(1)
        backend.close()

        fresh_s = median_s(lambda: built(model, paths.run_dir, None), args.repeat)
        resumed_s = median_s(lambda: built(model, paths.run_dir, checkpoint), args.repeat)
        print(
            f"resume: backend from the checkpoint {resumed_s:.3f} s, without one {fresh_s:.3f} s "
            f"(the checkpoint adds {resumed_s - fresh_s:+.3f} s, {resumed_s / fresh_s:.2f}x)"
        )

        padding = Path(checkpoint.path) / "padding.bin"
        block = bytes(range(256)) * (CHUNK_BYTES // 256)
        with padding.open("wb") as handle:
            for _ in range(args.archive_mb):
                handle.write(block)
        paths.trainer_state.write_text(json.dumps({"checkpoints": [checkpoint.as_record()]}))
        top, files = checkpoint_files(paths, 1)
        megabytes = sum(path.stat().st_size for path in files) / 1e6

        def stream() -> None:
            for _ in tar_stream(top, files):
                pass

        def plain_read() -> None:
            for path in files:
                with path.open("rb") as handle:
                    while handle.read(CHUNK_BYTES):
                        pass

        archive_s, read_s = median_s(stream, args.repeat), median_s(plain_read, args.repeat)
        print(
            f"archive: {megabytes / archive_s:,.0f} MB/s streamed as tar ({megabytes:.0f} MB), plain reads "
            f"{megabytes / read_s:,.0f} MB/s (tar framing costs {archive_s / read_s:.2f}x)"
        )
        padding.unlink()

        outputs = iter(range(10_000))
        merge_s = median_s(
            lambda: merge_adapter(str(model), Path(checkpoint.path), root / f"m{next(outputs)}"), args.repeat
        )

        def base_only() -> None:
            from transformers import AutoModelForCausalLM

            AutoModelForCausalLM.from_pretrained(str(model), dtype="float32")

        load_s = median_s(base_only, args.repeat)
        print(f"merge: {merge_s:.3f} s (loading the base alone {load_s:.3f} s, {merge_s / load_s:.1f}x)")


if __name__ == "__main__":
    main()
