"""Flags and option files that several commands and the host options share, parsed into typed values."""
