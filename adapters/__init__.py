"""Adapter registry: versioned LoRA adapters, their files, receipts and (later) promotions."""
