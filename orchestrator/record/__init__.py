"""Where a study lives and what is stored with it: the storage URL and its RDBStorage, riding out outages, our orch_* tables and migrations, the study's settings, trial attributes, logs and notes.

May import the base (`errors`, `imports`, `gpu`) only; every layer above reads and writes through it.
"""
