from tests.promotions.support import home  # noqa: F401
