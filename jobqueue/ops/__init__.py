"""Running and watching the queue: the `jobqueue` command (`cli`), the HTTP API
(`api`), Prometheus metrics (`metrics`), log formats (`logs`) and the figures
of `jobqueue status` (`status`). The queue itself never imports these.
"""
