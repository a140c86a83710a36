"""Outputs of the analysis: terminal tables, JSON, HTML, diffs and a Perfetto trace."""
