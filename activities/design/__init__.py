"""The design family's activities: ``pipeline`` (load, intake, codegen, validate,
persist), ``codegen`` (the repository renderer) and ``validators`` (checks on it)."""

from activities.design.pipeline import DesignActivities

__all__ = ["DesignActivities"]
