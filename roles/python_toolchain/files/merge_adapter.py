"""Merge a PEFT LoRA adapter into its base model, writing a NEW model directory.

Runs inside the python_toolchain venv (stdlib, torch, transformers and peft
only): `llmfleet model merge-adapter` and playbooks/merge_adapter.yml both run
this one file, so there is one implementation of the merge.

    python merge_adapter.py --base DIR --adapter DIR --out DIR

- OUT must not exist, or be an empty directory: a merge never overwrites a model.
- The merge is written to a temporary directory beside OUT and renamed to OUT
  only once complete, so a failed or interrupted merge leaves no OUT at all.
- The base is loaded in float32 and merged there (W + scale * B @ A, exactly as
  PEFT's merge_and_unload computes it), then cast back to the base's dtype once,
  so the merged weights carry one rounding, not one per step.
- The tokenizer files and the chat template are copied from the base byte for
  byte; config.json and the weights (safetensors) are written by transformers.
- `llmfleet-merge.json` records what was merged with which toolchain.
- Files are left readable by everyone (0644; safetensors writes 0600), since
  the engine may run as another user than the merge.

Exit 0 with one JSON line (what was written) on stdout; exit 2 with one line on
stderr when the input is refused (OUT not empty, no adapter, ...); any other
failure is a traceback and exit 1. Nothing is downloaded (offline mode).
"""

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# Files copied from the base as they are: tokenizers of every kind, the chat
# template in each form transformers keeps it, and the generation defaults.
COPIED = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)
RECORD = "llmfleet-merge.json"


def refuse(message):
    print(f"merge_adapter: refused: {message}", file=sys.stderr)
    sys.exit(2)


def check_input(base, adapter, out):
    if not (base / "config.json").is_file():
        refuse(f"{base} is not a model directory (no config.json)")
    if not (adapter / "adapter_config.json").is_file():
        refuse(f"{adapter} is not a PEFT adapter directory (no adapter_config.json)")
    config = json.loads((adapter / "adapter_config.json").read_text())
    if config.get("peft_type") != "LORA":
        refuse(f"{adapter}: peft_type is {config.get('peft_type')!r}; this merges LoRA adapters only")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        refuse(f"{out} exists and is not an empty directory; a merge writes a new directory, give another --out")
    if not out.parent.is_dir():
        refuse(f"{out.parent} does not exist; create it first")
    return config


def merge(base, adapter, out):
    import peft
    import torch
    import transformers

    config = check_input(base, adapter, out)
    base_config = json.loads((base / "config.json").read_text())
    dtype_name = base_config.get("dtype") or base_config.get("torch_dtype") or "float32"
    dtype = getattr(torch, dtype_name)

    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, local_files_only=True)
    model = peft.PeftModel.from_pretrained(model, adapter, local_files_only=True)
    merged = model.merge_and_unload(safe_merge=True)
    merged = merged.to(dtype)

    temporary = out.parent / f".{out.name}.merge-{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    try:
        merged.save_pretrained(temporary, safe_serialization=True)
        copied = []
        for name in COPIED:
            if (base / name).is_file():
                shutil.copy2(base / name, temporary / name)
                copied.append(name)
        record = {
            "base": str(base.resolve()),
            "adapter": str(adapter.resolve()),
            "adapter_rank": config.get("r"),
            "adapter_alpha": config.get("lora_alpha"),
            "adapter_target_modules": config.get("target_modules"),
            "dtype": dtype_name,
            "merged_in": "float32",
            "toolchain": {
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "peft": peft.__version__,
            },
        }
        (temporary / RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        # safetensors writes its file 0600; engines often run as another user.
        for path in temporary.iterdir():
            path.chmod(0o644)
        temporary.chmod(0o755)
        if out.exists():  # an empty directory, checked above
            out.rmdir()
        temporary.rename(out)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    files = sorted(path.name for path in out.iterdir())
    return {"out": str(out), "files": files, "copied_from_base": copied, **record}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, type=Path, help="the base model directory")
    parser.add_argument("--adapter", required=True, type=Path, help="the PEFT LoRA adapter directory")
    parser.add_argument("--out", required=True, type=Path, help="the new directory for the merged model")
    args = parser.parse_args(argv)
    result = merge(args.base, args.adapter, args.out.absolute())
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
