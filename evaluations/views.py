"""Dashboard pages of evaluations (/ui/evaluations/): today the evaluation jobs' table.

Web-facing: never imports torch or gpu_runtime.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required

from core.jobs.fragments import category_page


@login_required
def evaluations(request):
    return category_page(request, category="evaluation", template="ui/evaluations.html")
