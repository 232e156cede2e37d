"""Read-only views of a stored study: `status`, `best`, `logs` and the HTML report.

May import the base and `record`; never `run`, `planning` or `deploy`: what it shows is what was stored.
"""
