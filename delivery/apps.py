from django.apps import AppConfig


class DeliveryConfig(AppConfig):
    name = "delivery"
    verbose_name = "Delivery"

    def ready(self) -> None:
        from delivery import checks  # noqa: F401  (registers the settings checks)
