"""Persistence: SQLAlchemy models, engine set-up and migrations."""
