"""Render a resolved job into sbatch / launch / rank-wrapper scripts."""

from orchestrator.render.render import Rendered, render

__all__ = ["Rendered", "render"]
