"""URL map of the dashboard under /ui/ (namespace "ui"): the shell's pages here, each app's own pages
from its urls.py; every page requires a logged-in user."""

from django.contrib.auth import views as auth_views
from django.urls import include, path

from adapters.urls import promotion_urlpatterns
from kiln_project.ui import openenv_views, views

app_name = "ui"
urlpatterns = [
    path("", views.overview, name="overview"),
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    # Training → OpenEnv: the OpenEnv app sits above training, so its page is wired here.
    path("training/openenv/", openenv_views.openenv_page, name="training_openenv"),
    path("training/openenv/inspect/", openenv_views.inspect_view, name="openenv_inspect"),
    path("training/openenv/environment-row/", openenv_views.environment_row, name="openenv_environment_row"),
    path("training/openenv/runs/<uuid:run_id>/cancel/", openenv_views.run_cancel_view, name="openenv_run_cancel"),
    path("training/", include("training.urls")),  # each app owns its pages
    path("adapters/", include("adapters.urls")),
    path("promotions/", include(promotion_urlpatterns)),
    path("evaluations/", include("evaluations.urls")),
    path("jobs/", views.jobs, name="jobs"),
    path("jobs/<uuid:job_id>/", views.job_detail, name="job_detail"),
    path("jobs/<uuid:job_id>/cancel/", views.job_cancel, name="job_cancel"),
    path("jobs/<uuid:job_id>/events/", views.job_events, name="job_events"),
]
