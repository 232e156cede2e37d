"""A study's report: one self-contained HTML page, its charts, and the same charts as PNGs."""
