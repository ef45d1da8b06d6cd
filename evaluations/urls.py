"""The evaluations app's pages under /ui/evaluations/ (included into the dashboard's "ui" namespace)."""

from django.urls import path

from evaluations import views

urlpatterns = [
    path("", views.evaluations, name="evaluations"),
    path("datasets/", views.datasets_page, name="evaluation_datasets"),
    path("datasets/<str:name>/", views.dataset_page, name="evaluation_dataset"),
    path("datasets/<str:name>/split/", views.dataset_split_view, name="evaluation_dataset_split"),
    path("datasets/<str:name>/synthesize/", views.dataset_synthesize_view, name="evaluation_dataset_synthesize"),
    path("datasets/<str:name>/delete/", views.dataset_delete_view, name="evaluation_dataset_delete"),
    path("suites/", views.suites_page, name="evaluation_suites"),
    path("suites/<str:name>/", views.suite_page, name="evaluation_suite"),
    path("suites/<str:name>/delete/", views.suite_delete_view, name="evaluation_suite_delete"),
    path("suites/<str:name>/run/", views.suite_run_view, name="evaluation_suite_run"),
    path("jobs/", views.eval_jobs_page, name="evaluation_jobs"),
    path("jobs/<uuid:job_id>/compare/", views.eval_compare_page, name="evaluation_compare"),
]
