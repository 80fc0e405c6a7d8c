"""`manage.py demo_key NAME`: a fresh API key for a development client, created if missing."""

from django.core.management.base import BaseCommand

from clients.repositories import client_create, client_key_issue


class Command(BaseCommand):
    help = "Prints a new API key for the named client, creating the client first if needed."

    def add_arguments(self, parser):
        parser.add_argument("name")

    def handle(self, *args, name, **options):
        issued = client_key_issue(name=name) or client_create(
            name=name, webhook_url="", is_operator=False
        )
        self.stdout.write(issued.api_key)
