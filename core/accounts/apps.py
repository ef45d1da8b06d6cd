from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "kiln_project.accounts"
    label = "accounts"
    verbose_name = "Accounts and API tokens"
