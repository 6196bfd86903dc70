"""What the queue is in the database: the `jobs` table (`models`), every
statement the queue runs (`queries.sql`, loaded by `queries`), the advisory
lock keys (`locks`), and the migrations that build it all (`alembic/`, applied
by `migrations`).
"""
