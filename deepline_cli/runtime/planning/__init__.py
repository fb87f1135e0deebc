"""`deepline plan`: a play walked without calling anything, through the same map and reuse code."""

__all__ = ["planner"]
