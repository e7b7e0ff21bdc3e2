"""`python -m rlctl.trainer --config RUN.yaml`: run the GRPO trainer for one run (docs/TRAINER.md)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from rlctl.trainer.config import ConfigError, load_config
from rlctl.trainer.loop import StopRequest, Trainer

EXIT_CONFIG_ERROR = 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlctl.trainer", description="GRPO trainer for one rlctl run.")
    parser.add_argument("--config", type=Path, required=True, help="the merged run YAML")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per /batch poll drowns the log
    stop = StopRequest()
    stop.install()  # before the slow start-up, so an early SIGTERM still ends cleanly
    try:
        config = load_config(args.config)
    except ConfigError as error:
        logging.getLogger("trainer").error("invalid run configuration: %s", error)
        return EXIT_CONFIG_ERROR
    return Trainer(config, stop).run()


if __name__ == "__main__":
    sys.exit(main())
