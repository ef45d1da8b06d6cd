from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "core.accounts"
    label = "accounts"
    verbose_name = "Accounts and API tokens"

    def ready(self):
        from django.contrib.auth.signals import user_login_failed

        from core.accounts.login_throttle import count_failed_login

        user_login_failed.connect(count_failed_login, dispatch_uid="kiln-login-address-throttle")
