"""`manage.py create_client NAME [--webhook-url URL] [--operator]` (contract section 1)."""

import json

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.core.validators import URLValidator

from clients.repositories import client_create
from notifyqueue.errors import Conflict


class Command(BaseCommand):
    help = "Creates an API client and prints its key (shown once) and webhook secret as JSON."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--webhook-url", default="")
        parser.add_argument("--operator", action="store_true")

    def handle(self, *args, name, webhook_url, operator, **options):
        if webhook_url:
            try:
                URLValidator(schemes=["http", "https"])(webhook_url)
            except ValidationError as exc:
                raise CommandError(f"--webhook-url must be an http(s) URL: {webhook_url}") from exc
        try:
            created = client_create(name=name, webhook_url=webhook_url, is_operator=operator)
        except Conflict as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(
            json.dumps(
                {
                    "client": created.name,
                    "api_key": created.api_key,
                    "webhook_secret": created.webhook_secret,
                }
            )
        )
