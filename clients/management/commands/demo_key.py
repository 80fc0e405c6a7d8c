"""`manage.py demo_key NAME [--operator] [--key-file PATH] [--webhook-url URL]`: the development
client's API key.

Used by `python3 dev.py serve`. Creates the client if it is missing; --webhook-url sets its
webhook URL (empty: none; `serve --webhooks` points it at a receiver on loopback). With
--key-file the key stored there is reused for as long as it still authenticates as that client,
so every run prints the same key; otherwise (or without the file) a new key is issued and
stored.
"""

from pathlib import Path

from django.core.management.base import BaseCommand

from clients.repositories import (
    client_create,
    client_key_authenticates,
    client_key_issue,
    client_operator_grant,
    client_webhook_url_set,
)


class Command(BaseCommand):
    help = "Prints an API key for the named development client, creating it if needed."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument(
            "--operator", action="store_true", help="make the client an operator (may retry)"
        )
        parser.add_argument("--key-file", type=Path, help="reuse the key stored here, or store it")
        parser.add_argument("--webhook-url", help="the client's webhook URL (empty: none)")

    def handle(self, *args, name, operator, key_file, webhook_url, **options):
        stored = key_file.read_text().strip() if key_file and key_file.exists() else ""
        if stored and client_key_authenticates(name=name, api_key=stored):
            key = stored
        else:
            issued = client_key_issue(name=name) or client_create(
                name=name, webhook_url="", is_operator=operator
            )
            key = issued.api_key
            if key_file:
                key_file.parent.mkdir(parents=True, exist_ok=True)
                key_file.touch(mode=0o600)
                key_file.write_text(key + "\n")
        if operator:
            client_operator_grant(name=name)
        if webhook_url is not None:
            client_webhook_url_set(name=name, webhook_url=webhook_url)
        self.stdout.write(key)
