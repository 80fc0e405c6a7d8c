"""`manage.py create_client NAME [--webhook-url URL] [--operator] [--critical]`
(contract section 1)."""

import json

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.core.validators import URLValidator

from clients.repositories import client_create
from notifyqueue.errors import Conflict
from notifyqueue.webhook_url import webhook_url_validate


class Command(BaseCommand):
    help = "Creates an API client and prints its key (shown once) and webhook secret as JSON."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument(
            "--webhook-url",
            default="",
            help="http(s); a private or loopback address is refused (the webhooks' SSRF rule).",
        )
        parser.add_argument(
            "--operator", action="store_true", help="May see and retry every client's work."
        )
        parser.add_argument(
            "--critical",
            action="store_true",
            help="May create CRITICAL notifications (off unless given).",
        )

    def handle(self, *args, name, webhook_url, operator, critical, **options):
        try:
            # The same rules as the admin's form: a well-formed http(s) URL, and no private
            # address or localhost unless NOTIFYQUEUE_WEBHOOK_ALLOW_PRIVATE is set.
            if webhook_url:
                URLValidator(schemes=["http", "https"])(webhook_url)
            webhook_url_validate(webhook_url)
        except ValidationError as exc:
            raise CommandError(f"--webhook-url: {' '.join(exc.messages)}") from exc
        try:
            created = client_create(
                name=name,
                webhook_url=webhook_url,
                is_operator=operator,
                may_send_critical=critical,
            )
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
