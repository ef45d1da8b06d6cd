"""The adapter registry's pages under /ui/adapters/ and its promotions under /ui/promotions/
(both included into the dashboard's "ui" namespace)."""

from django.urls import path

from adapters import promotion_views, ui_actions, views

urlpatterns = [
    path("", views.adapters, name="adapters"),
    path("<str:name>/", views.adapter_detail, name="adapter_detail"),
    path("<str:name>/activate/", ui_actions.adapter_activate_view, name="adapter_activate"),
    path("<str:name>/delete/", ui_actions.adapter_delete_view, name="adapter_delete"),
]
promotion_urlpatterns = [
    path("", promotion_views.promotions, name="promotions"),
    path("<int:promotion_id>/", promotion_views.promotion_detail, name="promotion_detail"),
    path("<int:promotion_id>/approve/", promotion_views.promotion_approve, name="promotion_approve"),
    path("<int:promotion_id>/reject/", promotion_views.promotion_reject, name="promotion_reject"),
]
