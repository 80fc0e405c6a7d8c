from django.apps import AppConfig


class HealthConfig(AppConfig):
    name = "health"
    label = "health"
    verbose_name = "Health"
