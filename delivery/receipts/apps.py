from django.apps import AppConfig


class ReceiptsConfig(AppConfig):
    # A small app inside `delivery`: what providers report after a send.
    name = "delivery.receipts"
    label = "receipts"
    verbose_name = "Provider delivery receipts"

    def ready(self) -> None:
        from delivery.receipts import checks  # noqa: F401  (registers the settings check)
