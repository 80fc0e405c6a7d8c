from django.apps import AppConfig


class ClientsConfig(AppConfig):
    name = "clients"
    verbose_name = "API clients"

    def ready(self) -> None:
        # Registers the OpenAPI description of API-key authentication.
        from clients import schema  # noqa: F401
