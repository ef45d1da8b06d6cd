"""The OpenEnv collector: seed-matched groups of stateful episodes, published as three artifacts.

Pure package: no Django, no ORM, no torch (import-linter checks it). The behavior policy is an
injected async callable (`policy.Policy`); `ChatCompletionPolicy` is Kiln's own chat route with
rollout provenance, over an injected transport. Facts: reference-spec §2.1-2.7, §4.4-4.8, §4.12.
"""

from openenv.collector.collect import Bundle, collect, collect_and_publish, publish
from openenv.collector.config import CollectionConfig
from openenv.collector.errors import CollectionError
from openenv.collector.policy import ChatCompletionPolicy, PolicyReply, PolicyRequest, Sampling

__all__ = ["Bundle", "ChatCompletionPolicy", "CollectionConfig", "CollectionError", "PolicyReply", "PolicyRequest",
           "Sampling", "collect", "collect_and_publish", "publish"]
