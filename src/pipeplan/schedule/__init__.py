"""Schedule IR and generators."""

from .generators import SCHEDULES, make_schedule
from .ir import Kind, Program, Schedule

__all__ = ["Kind", "Program", "Schedule", "SCHEDULES", "make_schedule"]
