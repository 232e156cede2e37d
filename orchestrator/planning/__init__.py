"""What fits on which GPU: the planner's pure arithmetic, memory models (declared, calibrated, learnt), workload classes.

May import the base and `record` (stored memory models).
"""
