"""Schedule IR and generators."""

from .check import check_schedule
from .generators import SCHEDULES, make_schedule
from .ir import Kind, Program, Schedule

__all__ = ["Kind", "Program", "Schedule", "SCHEDULES", "check_schedule", "make_schedule"]
