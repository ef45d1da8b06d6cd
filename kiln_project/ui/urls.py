"""URL map of the dashboard under /ui/ (namespace "ui"); every page requires a logged-in user."""

from django.contrib.auth import views as auth_views
from django.urls import path
from django.views.generic import RedirectView

from kiln_project.ui import views
from training import rollout_views
from training import views as training_views

app_name = "ui"
urlpatterns = [
    path("", views.overview, name="overview"),
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("training/", RedirectView.as_view(pattern_name="ui:training_grpo", permanent=False), name="training"),
    path("training/grpo/", training_views.grpo_page, name="training_grpo"),
    path("training/rollouts/", rollout_views.rollouts_page, name="training_rollouts"),
    path("training/rollouts/scorers/", rollout_views.scorer_register_view, name="scorer_register"),
    path("training/rollouts/<uuid:job_id>/files/<str:name>", rollout_views.rollout_file_view, name="rollout_file"),
    path("training/rollouts/<uuid:job_id>/train/", rollout_views.rollouts_train_view, name="rollouts_train"),
    path("training/openenv/", views.training_openenv, name="training_openenv"),
    path("adapters/", views.adapters, name="adapters"),
    path("adapters/<str:name>/", views.adapter_detail, name="adapter_detail"),
    path("evaluations/", views.evaluations, name="evaluations"),
    path("promotions/", views.promotions, name="promotions"),
    path("jobs/", views.jobs, name="jobs"),
    path("jobs/<uuid:job_id>/", views.job_detail, name="job_detail"),
    path("jobs/<uuid:job_id>/cancel/", views.job_cancel, name="job_cancel"),
]
