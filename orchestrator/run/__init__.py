"""Running a study on one host: the pool loop and its per-GPU supervisors, admission by bytes, and the warm trial processes with what they say to each other.

May import the base, `record` and `planning`; never `show` or `deploy`.
"""
