"""The result spool: a finished trial's outcome kept on this host's disk until the database has it."""
