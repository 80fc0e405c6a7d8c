"""The OpenAPI schema describes every endpoint and generates without warnings."""

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


def test_schema_lists_every_notification_endpoint_with_its_answers():
    response = APIClient().get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    paths = schema["paths"]
    # Besides its own answers, every operation documents those of the layers every request
    # passes (notifyqueue/openapi.py): COMMON; with a body, BODY; with a path parameter, 404.
    common = {"400", "401", "406", "414", "429", "431", "503"}
    body = {"413", "415"}
    expected = {
        ("/api/v1/notifications", "post"): common | body | {"200", "201", "403", "409", "422"},
        ("/api/v1/notifications", "get"): common | {"200"},
        ("/api/v1/notifications/{notification_id}", "get"): common | {"200", "404"},
        ("/api/v1/notifications/{notification_id}/cancel", "post"): common | {"200", "404", "409"},
        ("/api/v1/notifications/{notification_id}/attempts", "get"): common | {"200", "404"},
        ("/api/v1/notifications/batch", "post"): common | body | {"200"},
    }
    for (path, method), statuses in expected.items():
        operation = paths[path][method]
        assert set(operation["responses"]) == statuses, (path, method)
        assert operation["security"] == [{"ApiKey": []}]
    create = paths["/api/v1/notifications"]["post"]
    header = next(p for p in create["parameters"] if p["in"] == "header")
    assert (header["name"], header["required"]) == ("Idempotency-Key", True)
    assert create["requestBody"]["content"]["application/json"]["examples"]
    assert schema["components"]["securitySchemes"]["ApiKey"]["name"] == "Authorization"


def test_schema_validates_with_no_warnings(tmp_path):
    call_command(
        "spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml")
    )
    assert (tmp_path / "schema.yaml").read_text().startswith("openapi: 3")


def test_swagger_ui_loads():
    response = APIClient().get("/api/docs/")
    assert response.status_code == 200
    assert b"swagger" in response.content.lower()
