"""Live dashboard updates over WebSockets, swapped in by htmx's ws extension.

Each consumer refuses anonymous users, joins its channel-layer groups (plus its session's group, so
that logging out closes every socket the session opened: see kiln_project/ui/sessions.py), then sends
a database snapshot; on every {"type": "job.changed"} message it re-reads the job from the database and sends
the re-rendered markup with hx-swap-oob. Messages carry only ids, so a lost message delays one
update and the next snapshot (any reconnect) catches up.
Web-facing: never imports torch, transformers, peft or gpu_runtime (import-linter enforces it).
"""

from __future__ import annotations

from urllib.parse import parse_qs

from asgiref.sync import async_to_sync
from channels.generic.websocket import WebsocketConsumer

from core.jobs import fragments, selectors
from core.jobs.broadcast import JOBS_GROUP, job_group
from core.jobs.models import JobState
from kiln_project.ui.sessions import SESSION_CLOSE_CODE, session_group
from training import fragments as training_fragments

MAX_LIMIT = 500


class _AuthenticatedConsumer(WebsocketConsumer):
    """Refuses the handshake (HTTP 403) unless the session belongs to a logged-in user."""

    groups_to_join: list[str]

    def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not self.prepare():
            self.close()
            return
        session = self.scope.get("session")
        session_key = getattr(session, "session_key", None)
        if not session_key:  # a socket no logout could reach is not opened
            self.close()
            return
        self.groups_to_join = [*self.groups_to_join, session_group(session_key)]
        for group in self.groups_to_join:
            async_to_sync(self.channel_layer.group_add)(group, self.channel_name)
        self.accept()
        self.send_snapshot()

    def disconnect(self, code):
        for group in getattr(self, "groups_to_join", []):
            async_to_sync(self.channel_layer.group_discard)(group, self.channel_name)

    def receive(self, text_data=None, bytes_data=None):
        """These sockets only push; anything the browser sends is ignored."""

    def send(self, text_data=None, bytes_data=None, close=False):
        """A push to a socket the browser closed meanwhile (its page moved on between the change and
        this update) is dropped: daphne raises it back here, and logged it as an application error.
        The disconnect that follows leaves the groups."""
        try:
            super().send(text_data=text_data, bytes_data=bytes_data, close=close)
        except RuntimeError as exc:  # autobahn's Disconnected
            if "closed protocol" not in str(exc):
                raise

    def session_ended(self, message):
        """The session logged out (kiln_project/ui/sessions.py): nothing more goes to this socket."""
        for group in self.groups_to_join:
            async_to_sync(self.channel_layer.group_discard)(group, self.channel_name)
        self.groups_to_join = []
        self.close(code=SESSION_CLOSE_CODE)

    def prepare(self) -> bool:
        raise NotImplementedError

    def send_snapshot(self) -> None:
        raise NotImplementedError


class JobListConsumer(_AuthenticatedConsumer):
    """/ws/ui/jobs/[?category=training&state=queued&limit=10]: rows of a jobs table, new jobs prepended.

    With a state filter, a shown job that leaves the state is taken off the table."""

    def prepare(self) -> bool:
        query = parse_qs(self.scope.get("query_string", b"").decode())
        self.category = (query.get("category") or [""])[0] or None
        self.state = (query.get("state") or [""])[0] or None
        if self.state is not None and self.state not in JobState.values:
            return False
        try:
            self.limit = max(1, min(MAX_LIMIT, int((query.get("limit") or [fragments.DEFAULT_LIMIT])[0])))
        except ValueError:
            self.limit = fragments.DEFAULT_LIMIT
        self.shown: set[str] = set()
        self.groups_to_join = [JOBS_GROUP]
        return True

    def send_snapshot(self) -> None:
        jobs = fragments.jobs_for_table(category=self.category, state=self.state, limit=self.limit)
        self.shown = {str(job.uuid) for job in jobs}
        self.send(text_data=fragments.render_jobs_body(jobs, category=self.category, state=self.state))

    def job_changed(self, message):
        job = selectors.job_get(job_id=message["job_id"])
        if job is None:
            return
        key = str(job.uuid)
        if not fragments.job_in_table(job, category=self.category, state=self.state):
            if key in self.shown:  # it left this table's state
                self.shown.discard(key)
                self.send(text_data=fragments.render_job_row_removal(job))
            return
        new = key not in self.shown
        self.shown.add(key)
        self.send(text_data=fragments.render_job_row(job, new=new))


class JobDetailConsumer(_AuthenticatedConsumer):
    """/ws/ui/jobs/<uuid>/: the live part of one job's page."""

    def prepare(self) -> bool:
        self.job_id = str(self.scope["url_route"]["kwargs"]["job_id"])
        if selectors.job_get(job_id=self.job_id) is None:
            return False
        self.groups_to_join = [job_group(self.job_id)]
        return True

    def send_snapshot(self) -> None:
        job = selectors.job_get(job_id=self.job_id)
        if job is not None:
            self.send(text_data=fragments.render_job_update(job))

    def job_changed(self, message):
        if message.get("job_id") == self.job_id:
            self.send_snapshot()


class TrainingQueueConsumer(_AuthenticatedConsumer):
    """/ws/ui/training/queue/: the GRPO page's queue block, re-rendered whole when a training job changes.

    Positions and the running slot depend on every training job, so the block is re-read from the
    database (training.selectors.training_queue) rather than patched row by row."""

    def prepare(self) -> bool:
        self.groups_to_join = [JOBS_GROUP]
        return True

    def send_snapshot(self) -> None:
        self.send(text_data=training_fragments.render_queue())

    def job_changed(self, message):
        job = selectors.job_get(job_id=message["job_id"])
        if job is not None and training_fragments.is_training_job(job):
            self.send_snapshot()
