"""Users' preferences in the admin: a page of a table with a row per user, never all of it."""

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext

from clients.models import Client
from tests.support.factories import ClientFactory

pytestmark = pytest.mark.django_db

LIST = "/admin/preferences/userpreferences/"


@pytest.fixture
def operator(client):
    client.force_login(User.objects.create_superuser("ops", "ops@example.com", "pw"))
    return client


def preferences_insert_bulk(client: Client, count: int) -> None:
    """`count` users of `client`, `user-1` … `user-<count>`."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO user_preferences (id, client_id, user_id, channels, addresses,
                                          muted_events, disabled_channels, created_at,
                                          updated_at)
            SELECT gen_random_uuid(), %s, 'user-' || g, '["email"]',
                   '{"email": "u@example.com"}', '[]', '[]', now(), now()
              FROM generate_series(1, %s) AS g
            """,
            [client.id, count],
        )
        cursor.execute("ANALYZE user_preferences")


@pytest.mark.parametrize(
    "query",
    [{}, {"p": "5"}, {"client__id__exact": None}, {"q": "user-1234"}],
    ids=["first page", "a later page", "one client", "search"],
)
def test_the_list_reads_a_page_not_every_user(operator, query):
    big, small = ClientFactory(), ClientFactory()
    preferences_insert_bulk(big, 20_000)
    preferences_insert_bulk(small, 150)
    if "client__id__exact" in query:
        query = {"client__id__exact": str(small.id)}

    with CaptureQueriesContext(connection) as queries:
        response = operator.get(LIST, query)

    assert response.status_code == 200
    page = response.context["cl"].result_list
    # (The clients joined to the page may be read whole: a small table, and its statistics
    # move with the other tests' clients.)
    plan = page.explain()
    assert "Seq Scan on user_preferences" not in plan, plan
    if "q" in query:
        # The user's rows, one a client at most, from the user id's index, then in order.
        assert "user_preferences_user" in plan, plan
    else:
        assert "Sort Key: user_preferences" not in plan, plan
    statements = [q["sql"].upper() for q in queries.captured_queries]
    assert not [s for s in statements if s.startswith("SELECT COUNT(*) AS")]
    if "q" in query:
        assert [p.user_id for p in page] == ["user-1234"]
    else:
        assert len(page) == 100
        keys = [(str(p.client_id), p.user_id) for p in page]
        assert keys == sorted(keys)


def test_the_search_is_an_exact_case_sensitive_user_id(operator):
    client = ClientFactory()
    preferences_insert_bulk(client, 3)
    page = operator.get(LIST, {"q": "USER-1"}).context["cl"].result_list
    assert list(page) == []
    assert [p.user_id for p in operator.get(LIST, {"q": " user-2 "}).context["cl"].result_list] == [
        "user-2"
    ]
