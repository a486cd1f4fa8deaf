"""``python -m orchestrator.plan``: the planner, which searches for the plan that meets a deadline
and a budget (:mod:`orchestrator.simulate.planner`).

It lives here, not in ``orchestrator/plan/__init__.py``, so that making a plan never imports the
simulation that plays it: nothing imports this module.
"""

from orchestrator.simulate.planner import main

if __name__ == "__main__":
    main()
