"""A trial's records: its attributes, logs, notes, re-runs, and the study's best trial."""
