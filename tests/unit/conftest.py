"""Unit tests: pure rules, and services over in-memory fakes. They run without a database.

pytest-django already refuses database access to a test without the `django_db` mark; this
also refuses the mark and the database fixtures here, so a test that needs PostgreSQL is put
in tests/integration/ rather than quietly turning this folder into a second integration suite.
"""

import pytest

DATABASE_FIXTURES = {"db", "transactional_db", "django_db_setup", "live_server", "database_url"}


@pytest.fixture(autouse=True)
def _no_database(request):
    asked = DATABASE_FIXTURES.intersection(request.fixturenames)
    if request.node.get_closest_marker("django_db") or asked:
        pytest.fail(
            f"{request.node.nodeid} needs the database ({sorted(asked) or 'django_db mark'}): "
            "it belongs in tests/integration/"
        )
