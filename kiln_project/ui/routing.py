"""WebSocket routes for live dashboard pages (kiln_project/asgi.py mounts them behind session auth)."""

from django.urls import path

from kiln_project.ui.consumers import JobDetailConsumer, JobListConsumer, TrainingQueueConsumer

websocket_urlpatterns = [
    path("ws/ui/jobs/", JobListConsumer.as_asgi(), name="ws_jobs"),
    path("ws/ui/jobs/<uuid:job_id>/", JobDetailConsumer.as_asgi(), name="ws_job"),
    path("ws/ui/training/queue/", TrainingQueueConsumer.as_asgi(), name="ws_training_queue"),
]
