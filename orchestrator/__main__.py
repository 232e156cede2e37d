"""`python -m orchestrator`: the command line, stopped by Ctrl-C or SIGTERM in one line."""

from orchestrator.interrupts import stopped_quietly

with stopped_quietly():
    from orchestrator.cli import main

    status = main()
raise SystemExit(status)
