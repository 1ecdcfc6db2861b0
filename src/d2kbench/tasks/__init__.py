"""Task format: schemas, loader and registry of the task folders under ``d2kbench/suite``."""

from d2kbench.tasks.loader import Task, TaskFileError, list_tasks, load_task

__all__ = ["Task", "TaskFileError", "list_tasks", "load_task"]
