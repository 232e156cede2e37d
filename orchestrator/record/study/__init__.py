"""A study's settings: what it optimises and with what, its name and folder, and its notes."""
