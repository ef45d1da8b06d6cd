"""Jobs and their events in /admin/: read-only, they are the audit trail of work."""

from django.contrib import admin

from core.admin_base import ReadOnlyAdmin
from core.jobs.models import Job, JobEvent, WorkerHeartbeat


class JobEventInline(admin.TabularInline):
    model = JobEvent
    extra = 0
    can_delete = False
    readonly_fields = ("type", "message", "data", "created_at")

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = ("uuid", "kind", "state", "progress", "submitted_by", "created_at", "finished_at")
    list_filter = ("kind", "state", "queue")
    search_fields = ("uuid", "title")
    inlines = [JobEventInline]


@admin.register(JobEvent)
class JobEventAdmin(ReadOnlyAdmin):
    list_display = ("job", "type", "message", "created_at")
    list_filter = ("type",)


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(ReadOnlyAdmin):
    list_display = ("worker_id", "queues", "last_seen", "stopped")
