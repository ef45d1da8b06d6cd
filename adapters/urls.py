"""The adapter registry's pages under /ui/adapters/ and its promotions under /ui/promotions/
(both included into the dashboard's "ui" namespace)."""

from django.urls import path

from adapters import views

urlpatterns = [
    path("", views.adapters, name="adapters"),
    path("<str:name>/", views.adapter_detail, name="adapter_detail"),
]
promotion_urlpatterns = [
    path("", views.promotions, name="promotions"),
]
