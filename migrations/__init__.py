"""Alembic chain for the orchestrator's own tables, shipped inside the package."""

# Marks this package as gpu-study-orchestrator's (see orchestrator.imports).
__gpu_study_orchestrator__ = True
