"""The evaluations app's pages under /ui/evaluations/ (included into the dashboard's "ui" namespace)."""

from django.urls import path

from evaluations import views

urlpatterns = [
    path("", views.evaluations, name="evaluations"),
]
