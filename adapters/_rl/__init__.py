"""What the DQN and PPO adapters share: the run's frame, its task, scoring, checkpoints and weights."""
