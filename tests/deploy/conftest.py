"""The control tests' service fixtures, for the deployment tests that need a controller
in-process."""

from tests.control.conftest import clock, make_service

__all__ = ["clock", "make_service"]
