"""Publish a LoRA adapter with non-zero weights into a stack's registry (run with the stack's env).

python -m tests.support.make_adapter NAME MODEL_DIR SEED
"""

import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kiln_project.settings")

import django  # noqa: E402

django.setup()

import torch  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from adapters.services import adapter_publish, adapter_reserve, adapters_root  # noqa: E402
from gpu_runtime.identity import adapter_files, file_manifest, manifest_digest  # noqa: E402

name, model_dir, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.manual_seed(seed)
model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
with torch.no_grad():
    for param_name, param in peft_model.named_parameters():
        if "lora_B" in param_name:
            param.normal_(0, 0.5)  # a fresh LoRA has B = 0 and changes nothing; this one does
target = adapters_root() / name
peft_model.save_pretrained(target)
adapter_reserve(name=name)
digest = manifest_digest(file_manifest(target, adapter_files(target)))
adapter_publish(name=name, path=target, content_sha256=digest, base_model_sha256="", loaded=False)
print(digest)
