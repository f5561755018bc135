"""Minimal Django settings for tests/apps/asgi_django.py: no database, no
installed apps, no middleware; the URLconf is the app module itself."""
SECRET_KEY = "sockherd-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "asgi_django"
INSTALLED_APPS: list[str] = []
MIDDLEWARE: list[str] = []
DATABASES: dict = {}
USE_TZ = True
