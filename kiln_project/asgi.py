"""ASGI entry point (daphne): HTTP through Django, WebSockets through Channels with session auth.

The web process never imports torch, transformers, peft or gpu_runtime; a test checks sys.modules.
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kiln_project.settings")

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

from kiln_project.ui.routing import websocket_urlpatterns  # noqa: E402
from kiln_project.ws_origin import SameSiteOriginValidator  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": SameSiteOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)),
                                             (settings.KILN.host, *settings.KILN.allowed_hosts)),
    }
)
