#!/usr/bin/env python3
"""Reward 1.0 when the last integer in the reply is the task's answer, else 0.0.

Reads one JSON object on stdin (task, request, response, content, usage, adapter, seed,
latency, latency_ms) and prints the reward. It never executes model output.
"""
import json
import re
import sys

row = json.load(sys.stdin)
numbers = re.findall(r"-?\d+", row["content"])
correct = bool(numbers) and int(numbers[-1]) == row["task"]["answer"]
print(1.0 if correct else 0.0)
