"""The ground floor of the event log: the database itself.

Owns the SQL tables (``tables``, created and changed only by Alembic migrations),
connecting to SQLite or PostgreSQL (``connection``), running the migrations from code
(``migrate``, whose ``SCHEMA_HEAD`` names the newest), and reading SQLite text that is
not UTF-8 (``sqlite_text``). The scheduler's, the autoscaler's and the declared file's
stores build on these too.

May import nothing of ours: every other floor of ``events`` builds on it.
"""

# Here, not in ``connection``: a command that opens no database (agent, gateway, token,
# settings) still resolves the URL in force, and should not load SQLAlchemy to do it.
DEFAULT_URL = "sqlite:///llmgw.db"
