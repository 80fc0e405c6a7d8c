from django.apps import AppConfig


class MessageTemplatesConfig(AppConfig):
    # The folder is `templates` (the design card's name); the label keeps it apart from
    # Django's own template machinery.
    name = "templates"
    label = "message_templates"
    verbose_name = "Message templates"
