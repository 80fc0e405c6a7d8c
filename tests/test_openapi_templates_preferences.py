"""The templates, preferences and inbox endpoints are described with their answers."""

import pytest
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


def test_schema_lists_the_templates_preferences_and_inbox_endpoints_with_examples():
    response = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    paths = response.json()["paths"]
    expected = {
        ("/api/v1/templates/{event}/{channel}", "put"): {"200", "201", "400", "401"},
        ("/api/v1/templates/{event}/{channel}", "get"): {"200", "401", "404"},
        ("/api/v1/users/{user_id}/preferences", "put"): {"200", "201", "400", "401"},
        ("/api/v1/users/{user_id}/preferences", "get"): {"200", "401", "404"},
        ("/api/v1/users/{user_id}/inbox", "get"): {"200", "400", "401"},
        ("/api/v1/users/{user_id}/inbox/{message_id}/read", "post"): {"200", "401", "404"},
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
