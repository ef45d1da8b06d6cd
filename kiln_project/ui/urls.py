from django.urls import path

from kiln_project.ui import views

app_name = "ui"
urlpatterns = [
    path("", views.overview, name="overview"),
]
