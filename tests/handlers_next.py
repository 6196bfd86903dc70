"""A worker that handles `delta` jobs only (`--import tests.handlers_next`)."""

from tests.routed_handlers import register

register("delta", "next")
