"""`python -m loadtest.plan`: kept for old scripts; the planner lives in `api/plan.py`."""

from __future__ import annotations

import sys

from api.plan import (
    PlanResult,
    Simulation,
    add_arguments,
    floor_gpus,
    format_plan,
    main,
    plan,
    poisson,
    run_args,
    simulate,
)

__all__ = ["PlanResult", "Simulation", "add_arguments", "floor_gpus", "format_plan", "main",
           "plan", "poisson", "run_args", "simulate"]

if __name__ == "__main__":
    sys.exit(main(prog="python -m loadtest.plan"))
