"""/v1/config: the effective configuration of this process (no secrets); and routes of the reference
spec this Kiln declares without implementing (judgments, the modeled preflight estimates: 501
not_implemented, so a client learns that at once rather than from a 404)."""

from __future__ import annotations

import importlib.util
import os

from django.conf import settings
from ninja import Body, Router

from core.errors import KilnError
from core.jobs.kinds import registered_kinds

router = Router(tags=["system"])


@router.get("config", summary="The effective configuration")
def get_config(request):
    return {
        "config": settings.KILN.public_dict(),
        "serving_profile": settings.KILN.serving_profile,
        # What every GRPO submission gets for the config fields its request leaves out.
        "training_defaults": settings.KILN.training_defaults,
        "job_kinds": [{"name": k.name, "queue": k.queue, "category": k.category} for k in registered_kinds()],
        "kernels": kernel_selection(),
    }


@router.post("judgments/{name}/{action}", summary="Compile or validate a judgment (not implemented: 501)")
def judgments(request, name: str, action: str, body: dict = Body(default_factory=dict)):  # noqa: B008
    """LLM-judge rubrics are not part of this Kiln; held-out evaluation scores with suites' scorers."""
    if action not in ("compile", "validate"):
        raise KilnError("not_found", f"no route POST /v1/judgments/{{name}}/{action}", status=404,
                        hint="POST /v1/judgments/{name}/compile or /validate")
    raise KilnError("not_implemented", "judgments are not implemented by this Kiln", status=501,
                    hint="score held-out work with an eval suite's scorer (exact, a registered scorer program): "
                         "GET /v1/eval/suites")


PREFLIGHT_ESTIMATES = ("capacity", "compatibility", "tiers", "tier_defaults")


@router.get("preflight/{estimate}", summary="Modeled capacity, compatibility and tier estimates (not implemented: 501)")
def preflight_estimates(request, estimate: str):
    """Reference-spec §1.5's modeled estimates. This Kiln answers what a real submission would meet
    instead: the GRPO dry run's checks and memory estimate, and the OpenEnv training preflight."""
    _refuse_estimate(estimate)


@router.post("preflight/{estimate}", summary="Modeled estimates for a request (not implemented: 501)")
def preflight_estimates_for(request, estimate: str, body: dict = Body(default_factory=dict)):  # noqa: B008
    _refuse_estimate(estimate)


def _refuse_estimate(estimate: str):
    if estimate not in PREFLIGHT_ESTIMATES:
        raise KilnError("not_found", f"no route /v1/preflight/{estimate[:64]}", status=404,
                        hint="/v1/preflight/" + ", /v1/preflight/".join(PREFLIGHT_ESTIMATES))
    raise KilnError("not_implemented", f"the modeled {estimate} estimate is not implemented by this Kiln",
                    status=501, hint="POST /v1/train/grpo with \"dry_run\": true answers the checks a submission "
                                     "meets and its memory estimate; POST /v1/openenv/training/preflight seals an "
                                     "OpenEnv training contract")


def kernel_selection() -> dict:
    """The GPU worker's kernel choice as far as this process can tell without importing torch or
    triton (the web process never does): the KILN_KERNELS mode and whether triton is installed.
    The worker decides per device (gpu_runtime.kernels.selection: Triton on CUDA, else torch) and
    records the choice and any fallback reason in each train receipt."""
    mode = os.environ.get("KILN_KERNELS", "auto").strip().lower() or "auto"
    installed = importlib.util.find_spec("triton") is not None
    interpreted = os.environ.get("TRITON_INTERPRET", "") not in ("", "0")
    if mode == "torch":
        on_cuda, reason = "torch", "KILN_KERNELS=torch"
    elif not installed:
        on_cuda, reason = "torch", "triton is not installed (pip install -e .[gpu])"
    else:
        on_cuda, reason = "triton", None
    return {
        "requested": mode,
        "triton_installed": installed,
        "backend_on_cuda": on_cuda,
        # Off CUDA Triton runs only when forced under the interpreter (the tests' CPU check).
        "backend_elsewhere": "triton" if mode == "triton" and on_cuda == "triton" and interpreted else "torch",
        "fallback_reason": reason,
        "recorded_in": "train receipt runtime.execution_provenance.kernels",
    }
