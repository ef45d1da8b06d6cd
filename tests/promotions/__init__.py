"""Promotions: request, approve, reject, the policy, the alarm and the verifier link (issue 13)."""
