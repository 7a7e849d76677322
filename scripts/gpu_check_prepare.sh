#!/usr/bin/env bash
# Here (no GPU needed): what `make gpu-check` needs on the GPU machine, in two ignored folders that
# the device call carries (see docs/benchmarks.md, "CUDA (H200)"):
#   .whl/              wheels for its Python 3.12 that its image lacks (xgrammar and its needs, msgspec, jsonschema)
#   .gpucheck/model/   SmolLM2-135M-Instruct's config and tokenizer, no weights (a random model of that shape is built there)
# flash-attn does not travel: flash-attn 2 only builds from source, and flash-attn 4's CuTe DSL runtime
# (nvidia-cutlass-dsl-libs-cu13, a 92 MB wheel, 66 MB even as .tar.xz) alone exceeds the 64 MiB a call carries.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
grep -qx '/.whl/' .git/info/exclude || echo '/.whl/' >> .git/info/exclude
grep -qx '/.gpucheck/' .git/info/exclude || echo '/.gpucheck/' >> .git/info/exclude
mkdir -p .whl .gpucheck/model
platforms=""
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64 manylinux_2_28_x86_64; do
    platforms="$platforms --platform $p"
done
# the GPU image has torch, transformers, triton, numpy, jinja2, tokenizers, grpcio, attrs, pytest
$PY -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $platforms -d .whl \
    xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 \
    typing-inspection==0.4.5 typing_extensions==4.16.0 msgspec==0.23.0 \
    jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
model=$($PY -m engine.model_files)
for f in config.json generation_config.json tokenizer.json tokenizer_config.json chat_template.jinja; do
    cp "$model/$f" .gpucheck/model/
done
du -sh .whl .gpucheck
