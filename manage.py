#!/usr/bin/env python
"""Django's command-line utility for Kiln (the `kiln` CLI wraps the common tasks)."""
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kiln_project.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
