"""The OpenEnv client: URL normalisation (`urls`), discovery (`discovery`), the Task API (`tasks`),
lock-step WebSocket sessions (`session`, `frames`), credentials (`credentials`), typed errors
(`errors`) and the action helpers (`actions`: parsing, schema validation, rewards, seeds).

Pure package: imports no Django, no ORM and no torch (import-linter checks it). Everything that
talks to a server is async (httpx + websockets); `inspect_sync` wraps discovery for the CLI.
Wire facts: reference-spec §4.1-4.4, §4.13 and spec/openenv-protocol.md.
"""

from openenv.client.actions import (
    ACTION_SCHEMA_VALIDATION_FAILED,
    INVALID_MODEL_ACTION,
    MODEL_ACTION_NO_OUTPUT,
    ActionSchema,
    effective_reset,
    environment_index,
    episode_return,
    generation_seed,
    group_seed,
    parse_action,
    parse_and_validate_action,
    reward_value,
)
from openenv.client.credentials import Credential, credential_from_env, credentials_for_urls
from openenv.client.discovery import (
    CLIENT_PROFILE,
    DiscoveryDocuments,
    Inspection,
    check_health,
    discovery_sha256,
    identity_differences,
    inspect,
    inspect_sync,
    schema_sha256,
)
from openenv.client.errors import OpenEnvError
from openenv.client.frames import ErrorFrame, Observation
from openenv.client.session import EpisodeStart, Session, open_episode, open_session
from openenv.client.tasks import task_catalog
from openenv.client.urls import Endpoint, normalize_url

__all__ = [
    "ACTION_SCHEMA_VALIDATION_FAILED", "CLIENT_PROFILE", "INVALID_MODEL_ACTION", "MODEL_ACTION_NO_OUTPUT",
    "ActionSchema", "Credential", "DiscoveryDocuments", "Endpoint", "EpisodeStart", "ErrorFrame", "Inspection",
    "Observation", "OpenEnvError", "Session", "check_health", "credential_from_env", "credentials_for_urls",
    "discovery_sha256", "effective_reset", "environment_index", "episode_return", "generation_seed",
    "group_seed", "identity_differences", "inspect", "inspect_sync", "normalize_url", "open_episode",
    "open_session", "parse_action", "parse_and_validate_action", "reward_value", "schema_sha256",
    "task_catalog",
]
