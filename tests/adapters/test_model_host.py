"""The GPU worker's model host sizes its sampler's cohort from `[sampler] max_batch_size`."""

from __future__ import annotations

import dataclasses

import pytest
from django.conf import settings

from core.jobs import worker_state


@pytest.mark.django_db
def test_the_sampler_decodes_as_many_rows_a_step_as_configured(tiny_model_dir, monkeypatch):
    from adapters.serving.runtime_host import ModelHost

    monkeypatch.setattr(settings, "KILN", dataclasses.replace(
        settings.KILN, model_path=tiny_model_dir, sampler_max_batch_size=3))
    host = ModelHost()
    host.start()
    try:
        host.wait_ready(timeout=120)
        assert host.sampler.max_batch_size == 3
        assert worker_state._worker_status["model"]["max_batch_size"] == 3
        # The tiny model's weights stay in cache: its projections are not packed, and the status says why.
        packed = worker_state._worker_status["model"]["packed_matmul"]
        assert packed["packed"] is False and "small model" in packed["reason"]
        # Five requests, at most three rows a step: all five complete, each to its token budget.
        from gpu_runtime.sample_types import SampleRequest
        from gpu_runtime.sampling import SamplingParams

        results = host.sampler.generate([
            SampleRequest(messages=[{"role": "user", "content": f"What is {i} + 1?"}],
                          sampling=SamplingParams(temperature=1.0, max_tokens=4), seed=i,
                          enable_thinking=False, ignore_eos=True)
            for i in range(5)
        ], timeout=60)
        assert [len(r.completion_token_ids) for r in results] == [4] * 5
    finally:
        host.stop()
