"""Redis connection options, in one place. Pure module (it only builds keyword arguments).

redis-py 8 closes a read after `socket_timeout` (5 s by default), so a blocking read that waits
longer (BLPOP for an inference event, channels_redis's BZPOPMIN for a page's next message) raised
TimeoutError: a chat completion running over 5 s answered 500, and every dashboard WebSocket was
closed after 5-6 s. A client that blocks waits as long as its own command's timeout says, plus a
margin for the answer to arrive; a periodic health check still notices a dead connection. (No
TCP keepalive option: the default private Redis is a unix socket, whose connections refuse it.)
"""

from __future__ import annotations

CONNECT_TIMEOUT_SECONDS = 5
BLOCKING_READ_MARGIN_SECONDS = 15
HEALTH_CHECK_INTERVAL_SECONDS = 30


def blocking_client_options(longest_block_seconds: float) -> dict:
    """Options for a client whose longest blocking command waits `longest_block_seconds`."""
    return {
        "socket_timeout": longest_block_seconds + BLOCKING_READ_MARGIN_SECONDS,
        "socket_connect_timeout": CONNECT_TIMEOUT_SECONDS,
        "health_check_interval": HEALTH_CHECK_INTERVAL_SECONDS,
    }
