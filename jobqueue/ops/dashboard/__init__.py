"""The dashboard: the queue seen in a browser.

`jobqueue serve` serves it at `/`, and every router `create_router` makes
carries it (`create_router(..., dashboard=False)` leaves it out), at `/` and
`/dashboard/…` under the router's prefix:

- `/`: jobs by status and queue, jobs finished per second and due →
  completion latency over the last ten minutes, the oldest due job, dead
  row versions and the last autovacuum, the workers; it refreshes itself.
- `/dashboard/jobs`: waiting, running, failed and completed jobs, by queue,
  type and time, a page at a time; `/dashboard/jobs/{id}`: one job, its
  attempts as a timeline, payload and result.
- Retry a failed job, cancel a waiting or running one, pause or resume a
  queue: each asks first, and the page says what happened.

Everything it serves is in this package (templates, one stylesheet, one
script, charts drawn on the server): nothing is built at install time and
nothing is fetched from elsewhere. How it guards itself: `auth`, `views`.
"""

from jobqueue.ops.dashboard.views import create_dashboard

__all__ = ["create_dashboard"]
