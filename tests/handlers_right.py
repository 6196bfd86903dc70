"""A worker that handles `beta` jobs only (`--import tests.handlers_right`)."""

from tests.routed_handlers import register

register("beta", "right")
