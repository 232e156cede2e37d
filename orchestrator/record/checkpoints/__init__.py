"""A trial's checkpoints and a population-based-training lineage's names and schedule."""
