"""What keeps an adapter from being deleted (adapters.services.adapter_delete): an open promotion for
it, a training still to run that warm-starts from it, and published adapters trained from it (unless
forced). Each raises the KilnError the delete answers with; nothing here writes."""

from __future__ import annotations

from adapters.models import Adapter, AdapterState, AdapterStatus
from adapters.selectors import adapter_status
from core.errors import KilnError


def refuse_while_a_training_builds_on(name: str) -> None:
    """A queued or running training that warm-starts from this adapter would fail at its start if the
    adapter went now (409 adapter_in_use; the runner's base_adapter_missing covers what slips past)."""
    for output in Adapter.objects.filter(base_adapter=name, state=AdapterState.WRITING).select_related("training_job"):
        if adapter_status(output) == AdapterStatus.WRITING:
            job = output.training_job
            raise KilnError("adapter_in_use", f"adapter {name!r} is the base adapter of {output.name!r}, which "
                            f"training job {job.uuid if job else '?'} is writing", status=409,
                            hint="wait for that training job to finish, or cancel it (kiln jobs cancel ID), "
                                 "then delete")


def descendants(name: str) -> list[str]:
    """The published adapters trained from `name` (their base_adapter)."""
    return sorted(Adapter.objects.filter(base_adapter=name, state=AdapterState.PUBLISHED).values_list("name", flat=True))


def refuse_descendants(name: str, children: list[str]) -> None:
    """QA: deleting math-r001 left math-r002 (trained from it) with `kiln adapters verify` reporting its
    base_adapter link broken, and nothing warned. Their receipts still name it, so say so first."""
    if children:
        shown = ", ".join(repr(child) for child in children[:5]) + (f" and {len(children) - 5} more"
                                                                  if len(children) > 5 else "")
        raise KilnError("adapter_has_descendants", f"adapter {name!r} is the base adapter of {shown}: deleting it "
                        "breaks their lineage (kiln adapters verify reports the base_adapter link broken)", status=409,
                        hint=f"keep it as the audit trail of what was trained from it, or delete it anyway with "
                             f"force=true (kiln adapters delete {name} --force)")


def refuse_while_promotion_open(name: str) -> None:
    """A reviewer must not be left deciding on an adapter that is gone: delete it only once its
    pending or approved promotions are decided and applied (409 adapter_promotion_open)."""
    from adapters.models import Promotion, PromotionState

    open_ids = list(Promotion.objects.filter(candidate=name, state__in=(PromotionState.PENDING, PromotionState.APPROVED))
                    .order_by("id").values_list("id", flat=True))
    if open_ids:
        raise KilnError("adapter_promotion_open", f"adapter {name!r} is the candidate of open promotion "
                        f"{', '.join(map(str, open_ids))}", status=409,
                        hint=f"reject it first (kiln promotions reject {open_ids[0]} --reason ...), or wait for it "
                             "to be applied")
