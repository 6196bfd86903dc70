"""Integrations with the frameworks an application already runs: `fastapi`
(a worker inside the app's process). Each imports its framework, so import
the one you use; `jobqueue` itself imports none of them."""
