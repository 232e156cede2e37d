"""The swarm's model of finished trials: a Gaussian process, the candidate moves, and the screens that pick one."""
