"""Maintenance tools for the kit's notebooks (not imported by the notebooks themselves)."""
