"""The study's database: its storage location, the one RDBStorage, our orch_* tables, locks and migrations."""
