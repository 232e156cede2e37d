"""Read-only views of a stored study: `status`, `best`, `logs` and the HTML report.

May import the base, `record` and the plugins (`adapters`, `samplers`); never `run`, `planning`
or `deploy`: what it shows is what was stored.
"""
