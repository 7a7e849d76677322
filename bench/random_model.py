"""A randomly initialised model of a real model's shape, for machines where the weights cannot go.

    python -m bench.random_model SRC_DIR OUT_DIR [--seed 0] [--layers N --hidden N ...]

SRC_DIR holds a Hugging Face model's config.json and tokenizer files (no weights needed). The
model is transformers' own class built from that config with a fixed seed (its standard
initialisation) and saved as safetensors, with the tokenizer files copied beside it. Every
engine path (paged attention, CUDA graphs, grammars, sampling) and every comparison with
transformers means the same with random weights of the real shape; only the text is gibberish.
Throughput depends only on the shapes.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja",
                   "special_tokens_map.json")


def build_random_model(src_dir: str | Path, out_dir: str | Path, seed: int = 0, **config_overrides) -> Path:
    """Write a random-weight copy of the model in src_dir to out_dir; returns out_dir.

    config_overrides replace config.json entries (e.g. num_hidden_layers=2 for a tiny test model).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    src, out = Path(src_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, out / name)
    config_dict = json.loads((src / "config.json").read_text())
    config_dict.update(config_overrides)
    (out / "config.json").write_text(json.dumps(config_dict, indent=2))
    config = AutoConfig.from_pretrained(out)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(build_random_model(args.src_dir, args.out_dir, args.seed))


if __name__ == "__main__":
    main()
