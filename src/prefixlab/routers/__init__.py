"""Routers of a fleet (one module each, registered by name): which replica serves each
arrival, from what a real router sees."""

from prefixlab.routers.base import Fleet, Loads, Router, make_router, register, registered

__all__ = ["Fleet", "Loads", "Router", "make_router", "register", "registered"]
