from django.apps import AppConfig


class MonitoringConfig(AppConfig):
    name = "monitoring"
    label = "monitoring"
    verbose_name = "Monitoring"
