"""Template filters for the dashboard templates."""
