"""schemathesis against the project's own OpenAPI schema.

Every operation gets generated requests, valid and invalid, through the real WSGI application
and real PostgreSQL; each answer must not be a 5xx, must use a status code the schema
documents for that operation, a documented content type, and match the documented body.
Bounded (EXAMPLES per operation and mode) so the whole run takes seconds.
"""

from __future__ import annotations

from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from notifyqueue.wsgi import application

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

EXAMPLES = 25
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def _operations():
    schema = schemathesis.openapi.from_wsgi("/api/schema/", application)
    return [result.ok() for result in schema.get_all_operations()]


def test_every_answer_is_documented_and_never_a_server_error(make_client):
    # One test for all operations: each test with committed data pays for a table flush.
    _, key = make_client("schemathesis", is_operator=True)
    auth = {"Authorization": f"Api-Key {key}"}
    failures = []
    answered: Counter[int] = Counter()
    operations = _operations()
    assert len(operations) >= 14
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                derandomize=True,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def run(case):
                response = case.call(headers=auth)
                answered[response.status_code] += 1
                case.validate_response(response, checks=CHECKS, headers=auth)

            try:
                run()
            except Exception as failure:
                failures.append(f"{operation.label} ({mode.value}): {failure}")
    assert not failures, "\n\n".join(failures)
    # The key works: generated requests got through to the views, not only to 401s.
    assert answered[200] + answered[201] > 50, answered
