"""What the queue is in the database: the `jobs` table (`models`), every
statement the queue runs (`queries.sql`, loaded by `queries`), the advisory
lock keys (`locks`), and the migrations that build it all (`alembic/`, applied
by `migrations`).
"""

#: The schema revision this code runs on: the newest migration in `alembic/`
#: (a test holds the two together). A worker started on an older schema waits
#: for `jobqueue migrate` instead of failing on a column that is not there.
REVISION = "0012"
