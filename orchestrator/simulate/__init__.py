"""Plan before you pay: the simulated run (provider=sim), the planner and the quota queue."""
