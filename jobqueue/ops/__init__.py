"""Running and watching the queue: the `jobqueue` command (`cli`), the HTTP API
(`api`), Prometheus metrics (`metrics`), log formats (`logs`), the figures
of `jobqueue status` (`status`) and what each queue holds and which waiting
jobs no live worker takes (`routing`). The queue itself never imports these.
"""
