from django.apps import AppConfig


class UiConfig(AppConfig):
    name = "kiln_project.ui"
    label = "ui"
    verbose_name = "Dashboard"

    def ready(self):
        from django.contrib.auth.signals import user_logged_out

        from kiln_project.ui.sessions import on_user_logged_out

        user_logged_out.connect(on_user_logged_out, dispatch_uid="kiln_ui_close_session_sockets")
