"""The training app's pages under /ui/training/ (included into the dashboard's "ui" namespace)."""

from django.urls import path
from django.views.generic import RedirectView

from training import rollout_views, views

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="ui:training_grpo", permanent=False), name="training"),
    path("grpo/", views.grpo_page, name="training_grpo"),
    path("rollouts/", rollout_views.rollouts_page, name="training_rollouts"),
    path("rollouts/scorers/", rollout_views.scorer_register_view, name="scorer_register"),
    path("rollouts/<uuid:job_id>/files/<str:name>", rollout_views.rollout_file_view, name="rollout_file"),
    path("rollouts/<uuid:job_id>/train/", rollout_views.rollouts_train_view, name="rollouts_train"),
]
