"""Pipeline stage."""
