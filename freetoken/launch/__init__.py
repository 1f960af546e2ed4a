"""`ft launch`: point a coding agent's own config at the local server."""

from freetoken.launch.agents import AGENTS, Plan, Target, plan
from freetoken.launch.files import FileEdit

__all__ = ["AGENTS", "FileEdit", "Plan", "Target", "plan"]
