"""The trial process's side of a run: a warm process that asks, trains and tells trial after trial."""
