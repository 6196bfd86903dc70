"""A worker that handles `alpha` jobs only (`--import tests.handlers_left`)."""

from tests.routed_handlers import register

register("alpha", "left")
