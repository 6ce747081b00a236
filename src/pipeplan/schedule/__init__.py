"""Schedule IR and generators."""

from .generators import GENERATORS, make_schedule
from .ir import Program, Schedule

__all__ = ["Program", "Schedule", "GENERATORS", "make_schedule"]
