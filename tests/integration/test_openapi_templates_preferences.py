"""The templates, preferences and inbox endpoints are described with their answers."""

import pytest
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


def test_schema_lists_the_templates_preferences_and_inbox_endpoints_with_examples():
    response = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    paths = response.json()["paths"]
    # Every operation can also answer 400 (NUL in a header), 406, 414/431 (gunicorn), 429
    # (throttle), 503 (its database session lost) and, with a path parameter, 404; one with a
    # body 413 and 415 (notifyqueue/openapi.py).
    READ = {"200", "400", "401", "404", "406", "414", "429", "431", "503"}
    WRITE = READ | {"201", "413", "415"}
    expected = {
        ("/api/v1/templates/{event}/{channel}", "put"): WRITE,
        ("/api/v1/templates/{event}/{channel}", "get"): READ,
        ("/api/v1/users/{user_id}/preferences", "put"): WRITE,
        ("/api/v1/users/{user_id}/preferences", "get"): READ,
        ("/api/v1/users/{user_id}/inbox", "get"): READ,
        ("/api/v1/users/{user_id}/inbox/{message_id}/read", "post"): READ,
    }
    for (path, method), statuses in expected.items():
        operation = paths[path][method]
        assert set(operation["responses"]) == statuses, (path, method)
        assert operation["security"] == [{"ApiKey": []}]
        examples = [
            content.get("examples")
            for answer in operation["responses"].values()
            for content in answer.get("content", {}).values()
        ]
        assert any(examples), (path, method)
    create = paths["/api/v1/notifications"]["post"]
    assert "422" in create["responses"]
