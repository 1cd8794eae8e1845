"""Reusable computations shipped with millwheel."""
