"""Views of a simulated timeline: a Perfetto/Chrome trace and a Gantt chart (PNG)."""

from .gantt import draw_gantt, gantt_figure
from .perfetto import to_trace, write_trace

__all__ = ["draw_gantt", "gantt_figure", "to_trace", "write_trace"]
