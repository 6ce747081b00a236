"""Schedule IR and generators."""

from .generators import ORDERS, make_schedule
from .ir import Program, Schedule

__all__ = ["Program", "Schedule", "ORDERS", "make_schedule"]
