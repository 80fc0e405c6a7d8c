"""Users' preferences in the admin: a page of a table with a row per user, never all of it."""

import pytest

from tests.support.factories import ClientFactory
from tests.support.operator_helpers import changelist_page, preferences_insert_bulk

pytestmark = pytest.mark.django_db

LIST = "/admin/preferences/userpreferences/"


@pytest.mark.parametrize(
    "query",
    [{}, {"p": "5"}, {"client__id__exact": None}, {"q": "user-1234"}],
    ids=["first page", "a later page", "one client", "search"],
)
def test_the_list_reads_a_page_not_every_user(superuser, query):
    big, small = ClientFactory(), ClientFactory()
    preferences_insert_bulk(big.id, 20_000)
    preferences_insert_bulk(small.id, 150)
    if "client__id__exact" in query:
        query = {"client__id__exact": str(small.id)}

    page, plan = changelist_page(superuser, LIST, query, "user_preferences")

    if "q" in query:
        # The user's rows, one a client at most, from the user id's index, then in order.
        assert "user_preferences_user" in plan, plan
        assert [p.user_id for p in page] == ["user-1234"]
    else:
        assert "Sort Key: user_preferences" not in plan, plan
        assert len(page) == 100
        keys = [(str(p.client_id), p.user_id) for p in page]
        assert keys == sorted(keys)


def test_the_search_is_an_exact_case_sensitive_user_id(superuser):
    client = ClientFactory()
    preferences_insert_bulk(client.id, 3)
    page = superuser.get(LIST, {"q": "USER-1"}).context["cl"].result_list
    assert list(page) == []
    found = superuser.get(LIST, {"q": " user-2 "}).context["cl"].result_list
    assert [p.user_id for p in found] == ["user-2"]
