from django.apps import AppConfig


class CircuitsConfig(AppConfig):
    # A small app inside `delivery`: the circuit breaker shared by every worker process.
    name = "delivery.circuits"
    label = "circuits"
    verbose_name = "Provider circuit breakers"
