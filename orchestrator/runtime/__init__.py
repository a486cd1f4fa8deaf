"""A run while it runs: the deployer, the supervisor, the control channel and progress."""
