"""Alembic chain for the orchestrator's own tables, shipped inside the package."""
