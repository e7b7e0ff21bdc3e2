"""The `rlctl` command: serve the API, manage the database, build the tiny local model, and call the API."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rlctl.service.client.commands import add_client_commands
from rlctl.service.settings import Settings

MIN_API_TOKEN_CHARS = 16  # a shorter RLCTL_API_TOKEN can be guessed; `rlctl tokens create` makes 48 characters


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "handler"):
        parser.print_help()
        return 2
    return int(args.handler(args) or 0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlctl", description="REST control plane for RL fine-tuning.")
    commands = parser.add_subparsers(title="commands")

    serve = commands.add_parser("serve", help="run the HTTP service")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.set_defaults(handler=cmd_serve)

    db = commands.add_parser("db", help="database schema").add_subparsers(title="db commands")
    upgrade = db.add_parser("upgrade", help="apply the migrations")
    upgrade.add_argument("--revision", default="head")
    upgrade.set_defaults(handler=cmd_db_upgrade)
    current = db.add_parser("current", help="show the schema revision")
    current.set_defaults(handler=cmd_db_current)

    model = commands.add_parser("model", help="local models").add_subparsers(title="model commands")
    tiny = model.add_parser("init-tiny", help="build a tiny random model and tokenizer (no download)")
    tiny.add_argument("directory", type=Path)
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(handler=cmd_model_init_tiny)
    serve_model = model.add_parser(
        "serve", help="serve a local model or checkpoint with the trainer's OpenAI-compatible server"
    )
    serve_model.add_argument("directory", help="the base model: a directory or a cached hub id")
    serve_model.add_argument("--adapter", help="a local checkpoint directory (runs/{id}/checkpoints/step_N)")
    serve_model.add_argument("--name", help="the model id to answer to (default: {run}/step-{N} for a checkpoint)")
    serve_model.add_argument("--host", default="127.0.0.1")
    serve_model.add_argument("--port", type=int, default=8001)
    serve_model.set_defaults(handler=cmd_model_serve)
    merge = model.add_parser("merge", help="merge a checkpoint's LoRA adapter into its base model (a new directory)")
    merge.add_argument("base", help="the base model: a directory or a cached hub id")
    merge.add_argument("checkpoint", help="a local checkpoint directory (runs/{id}/checkpoints/step_N)")
    merge.add_argument("output", help="a new directory for the merged model")
    merge.set_defaults(handler=cmd_model_merge)

    tokens = commands.add_parser("tokens", help="API tokens with scopes (docs/AUTH.md)").add_subparsers(
        title="tokens commands"
    )
    create = tokens.add_parser("create", help="create a token: printed once, only its hash is stored")
    create.add_argument("--name", required=True)
    create.add_argument("--scope", action="append", required=True, help="read, operate or admin (repeatable)")
    create.set_defaults(handler=cmd_tokens_create)
    tokens.add_parser("list", help="names, scopes and creation times").set_defaults(handler=cmd_tokens_list)
    revoke = tokens.add_parser("revoke", help="revoke a token by name (takes effect at once)")
    revoke.add_argument("name")
    revoke.set_defaults(handler=cmd_tokens_revoke)

    add_client_commands(parser, commands)  # envs, runs, jobs, datasets, inference-test: over HTTP
    return parser


def cmd_serve(args: argparse.Namespace) -> int:
    from rlctl.service.auth.guard import is_loopback, is_open
    from rlctl.service.auth.tokens import TokenStore
    from rlctl.service.observability import configure_logging
    from rlctl.service.startup import build_app_context, start_up_work

    # Every file the service and its children create is its owner's only: the database, logs, run directories.
    os.umask(0o077)
    settings = Settings()
    token = settings.api_token.get_secret_value() if settings.api_token is not None else None
    if token is not None and len(token) < MIN_API_TOKEN_CHARS:
        print(
            f"refusing to start: RLCTL_API_TOKEN has {len(token)} characters, fewer than {MIN_API_TOKEN_CHARS} "
            "(make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))')",
            file=sys.stderr,
        )
        return 2
    if is_open(settings, tokens_file=TokenStore(settings.tokens_path).exists()) and not is_loopback(args.host):
        print(
            f"refusing to listen on {args.host} without RLCTL_API_TOKEN: set a token, or bind to 127.0.0.1",
            file=sys.stderr,
        )
        return 2
    configure_logging(settings.log_level, settings.log_format, settings.secret_values)
    context = build_app_context(settings)
    # The start-up work's children run while the app's modules import (seconds): docs/RUNS.md#start-up-work.
    context.start_warm_up(start_up_work(context))
    try:
        import uvicorn

        from rlctl.service import heap
        from rlctl.service.app import create_app
        from rlctl.service.http import server_config

        app = create_app(settings, context=context)
        heap.settle()
        server = uvicorn.Server(server_config(app, args.host, args.port))
        server.run()
    finally:
        context.stop_children()
    return 0 if server.started else 3  # as uvicorn.run: the app did not start (e.g. the port is taken)


def cmd_model_serve(args: argparse.Namespace) -> int:
    from rlctl.trainer.serve import main as serve

    argv = [args.directory, "--host", args.host, "--port", str(args.port)]
    argv += ["--adapter", args.adapter] if args.adapter else []
    return serve([*argv, *(["--name", args.name] if args.name else [])])


def cmd_model_merge(args: argparse.Namespace) -> int:
    from rlctl.trainer.merge import main as merge

    return merge([args.base, args.checkpoint, args.output])


def cmd_tokens_create(args: argparse.Namespace) -> int:
    from rlctl.service.auth.scopes import parse_scopes
    from rlctl.service.auth.tokens import TokenFileError, TokenStore

    try:
        token = TokenStore(Settings().tokens_path).create(args.name, parse_scopes(args.scope))
    except (TokenFileError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(token)  # the only time the token is shown: the file keeps its hash
    return 0


def cmd_tokens_list(_args: argparse.Namespace) -> int:
    from rlctl.service.auth.tokens import TokenFileError, TokenStore

    try:
        entries = TokenStore(Settings().tokens_path).entries()
    except TokenFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for entry in entries:
        print(f"{entry.name}\t{','.join(s.value for s in entry.scopes)}\t{entry.created_at}")
    return 0


def cmd_tokens_revoke(args: argparse.Namespace) -> int:
    from rlctl.service.auth.tokens import TokenFileError, TokenStore

    try:
        TokenStore(Settings().tokens_path).revoke(args.name)
    except TokenFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"revoked {args.name}")
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from rlctl.service.db import migrate
    from rlctl.service.db.engine import Database

    db = Database(Settings().sqlalchemy_url)
    migrate.upgrade(db, args.revision)
    print(f"database at revision {migrate.current_revision(db)}")
    db.dispose()
    return 0


def cmd_db_current(_args: argparse.Namespace) -> int:
    from rlctl.service.db import migrate
    from rlctl.service.db.engine import Database

    db = Database(Settings().sqlalchemy_url)
    current, head = migrate.current_revision(db), migrate.head_revision()
    print(f"current {current}, head {head}")
    db.dispose()
    return 0 if current == head else 1


def cmd_model_init_tiny(args: argparse.Namespace) -> int:
    from rlctl.trainer.tiny_model import init_tiny_model

    path = init_tiny_model(args.directory, seed=args.seed)
    print(f"tiny model ready in {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
