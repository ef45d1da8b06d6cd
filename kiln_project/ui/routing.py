"""WebSocket routes for live dashboard pages."""

websocket_urlpatterns = []
