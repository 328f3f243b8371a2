# The README's commands. `make demo` and `make test` each set up .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch 2.13.0's CPU wheel lies in /opt/wheels on this workplace's machines; elsewhere pip finds it
# on its own index.
WHEELS := $(wildcard /opt/wheels)
PIP_FLAGS := $(if $(WHEELS),--find-links $(WHEELS),)

# The report's browser test drives Debian's Chromium; `make test` installs it when missing.
CHROMIUM := $(shell command -v chromium 2>/dev/null)
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: demo scratch test test-full lint format seeds inference-options report-speed gamma-speed report-cap report-scale classify-memory ray-classify serve-load batching-speed bench long-documents planted-keyword calibration label-audit faithfulness streaming-speed encoder-speed cpu-bf16-speed cold-start corpora browser clean

# lxt (AttnLRP's reference implementation, for the tests that check docclass's relevance rules
# against it) is installed without its dependencies: they include open_clip_torch and
# bitsandbytes, which would pull torchvision and another torch build; its rules need torch alone.
# Byte-compiled once at set-up: where PYTHONDONTWRITEBYTECODE is set (this workplace's
# machines) no process caches what it compiles, and without it every one (each test's
# subprocess, each Ray worker) compiled torch again: make test took 20 minutes instead of 10.
# compileall on every core rather than pip's one-file-at-a-time compile: the same files
# (19,932), the set-up 94 s instead of 128 s on 2 cores. The one file that does not compile
# under Python 3.11 (torch's test helper written for 3.12) is left out by name, so any other
# failure (a full disk) stops the set-up rather than leaving an environment that caches nothing.
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-compile $(PIP_FLAGS) -e ".[dev]"
	$(BIN)/python -m pip install --quiet --no-compile --no-deps "lxt==2.1"
	$(BIN)/python -m compileall -q -j 0 -x 'py312_intrinsics' $(VENV)/lib
	touch $(STAMP)

demo: $(STAMP)  ## a faster variant of the recommended model (MiniLM on whole articles, lowest 5 blocks held) on the embedded BBC corpus: train, test, report into reports/demo/
	$(BIN)/docclass fit --config configs/demo.yaml

scratch: $(STAMP)  ## the from-scratch model on BBC (configs/bbc.yaml, ~3 min) into reports/bbc/, which the speed benchmarks below read
	$(BIN)/docclass fit --config configs/bbc.yaml

browser:  ## headless Chromium for the report's browser test (Debian package)
ifeq ($(CHROMIUM),)
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium > /dev/null
endif

# DOCCLASS_REQUIRE_BROWSER: here a missing browser fails the browser test instead of skipping it.
# TEST_WORKERS pytest processes (pytest-xdist), each given whole files, so a module's fixtures are
# built once; tests/conftest.py gives each worker one thread (docs/architecture.md#tests).
TEST_WORKERS ?= 2
test: $(STAMP) browser  ## the fast suite (CI)
	DOCCLASS_REQUIRE_BROWSER=1 $(BIN)/python -m pytest -m "not slow" -n $(TEST_WORKERS) --dist loadfile

test-full: $(STAMP) browser  ## every test, slow ones included
	DOCCLASS_REQUIRE_BROWSER=1 $(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check docclass benchmarks scripts tests
	$(BIN)/ruff format --check docclass benchmarks scripts tests

format: $(STAMP)
	$(BIN)/ruff format docclass benchmarks scripts tests
	$(BIN)/ruff check --fix docclass benchmarks scripts tests

seeds: $(STAMP)  ## the from-scratch config over three seeds: the spread the README quotes
	$(BIN)/python -m scripts.seeds configs/bbc.yaml --seeds 0 1 2 --out reports/seeds/bbc \
		--summary reports/bbc-seeds.json

report-speed: $(STAMP)  ## time the HTML report of the BBC test split, both configs (after `make scratch` and `docclass fit --config configs/minilm.yaml`)
	$(BIN)/python -m scripts.report_speed --ckpt reports/bbc/checkpoints/last.ckpt \
		--data configs/bbc.yaml --out reports/report-speed.json
	$(BIN)/python -m scripts.report_speed --ckpt reports/minilm/checkpoints/last.ckpt \
		--data configs/minilm.yaml --out reports/report-speed-minilm.json

gamma-speed: $(STAMP)  ## a linear layer's forward and LRP-γ backward pass at MiniLM's sizes: the shipped form, the five-product one it replaced, LRP-0's (~1 min)
	$(BIN)/python -m scripts.gamma_backward_speed --out reports/gamma-backward-speed.json

report-scale: $(STAMP) browser  ## report size and first paint in Chromium, 300 and 1,000 documents: 150 synthetic intents, BBC (after `make scratch`; ~12 min on 2 free cores)
	$(BIN)/python -m scripts.report_scale --bbc-ckpt reports/bbc/checkpoints/last.ckpt \
		--sizes 300 1000 --out reports/report-scale.json

cold-start: $(STAMP)  ## start-up of docclass --help and classify against `import torch`, as ratios (after `make scratch`)
	$(BIN)/python -m scripts.cold_start --ckpt reports/bbc/checkpoints/last.ckpt --out reports/cold-start.json

classify-memory: $(STAMP)  ## peak memory of `docclass classify` as the corpus grows (after `make scratch`)
	$(BIN)/python -m scripts.classify_memory --ckpt reports/bbc/checkpoints/last.ckpt \
		--sizes 2000 20000 200000 --out reports/classify-memory.json

ray-classify: $(STAMP)  ## classify --engine ray (2 workers) ÷ single-process classify, 1M short + 100k BBC-length documents (after `make scratch`; ~25 min)
	$(BIN)/python -m scripts.ray_classify --ckpt reports/bbc/checkpoints/last.ckpt --out reports/ray-classify.json

inference-options: $(STAMP)  ## classify on CPU: float32 vs torch.compile, int8, bf16, beside TF-IDF+SVM and fastText (after `make scratch`; ~3 min)
	$(BIN)/python -m pip install --quiet $(PIP_FLAGS) -e ".[bench]"
	$(BIN)/python -m scripts.inference_options --ckpt reports/bbc/checkpoints/last.ckpt --out reports/inference-options

bench: $(STAMP)  ## docclass vs nn.TransformerEncoder and vs transformers' BERT, inference, anchors (after `make scratch`; ~9 min)
	$(BIN)/python -m pip install --quiet $(PIP_FLAGS) -e ".[bench]"
	$(BIN)/python -m scripts.bench --ckpt reports/bbc/checkpoints/last.ckpt --out reports/bench
	$(BIN)/python -m scripts.encoder_speed --config configs/minilm-128.yaml --windows_config configs/minilm.yaml \
		--out reports/encoder-speed.json

faithfulness: $(STAMP)  ## every faithfulness figure of the BBC test split, into the from-scratch model's report, reports/bbc/report (after `make scratch`; ~5 min)
	$(BIN)/docclass faithfulness --ckpt reports/bbc/checkpoints/last.ckpt \
		--data configs/bbc.yaml --out reports/bbc/report
	cp reports/bbc/report/faithfulness.json reports/faithfulness-bbc.json

streaming-speed: $(STAMP)  ## the streamed training path beside the in-memory one on BBC (~3 min)
	$(BIN)/python -m scripts.streaming_speed --out reports/streaming-speed.json

report-cap: $(STAMP)  ## the after-fit report on a 70,000-document split, capped vs whole (after `make scratch`)
	$(BIN)/python -m scripts.report_cap --ckpt reports/bbc/checkpoints/last.ckpt \
		--out reports/report-cap.json

corpora: $(STAMP)  ## recommended configs vs TF-IDF+LinearSVC on BBC and ../shared/datasets, 3 seeds (long: see docs/benchmarks.md)
	$(BIN)/python -m pip install --quiet $(PIP_FLAGS) -e ".[bench]"
	$(BIN)/python -m scripts.corpora --seeds 0 1 2 --out reports/corpora

encoder-speed: $(STAMP)  ## docclass's MiniLM beside transformers' BertForSequenceClassification, same batches; whole-document windows in length groups against one padding (~5 min)
	$(BIN)/python -m scripts.encoder_speed --config configs/minilm-128.yaml --windows_config configs/minilm.yaml \
		--out reports/encoder-speed.json

cpu-bf16-speed: $(STAMP)  ## model.cpu_train_precision: the demo's held-block states and top-block training steps, float32 beside bf16 on this CPU (~2 min)
	$(BIN)/python -m scripts.cpu_bf16_speed --config configs/demo.yaml --out reports/cpu-bf16-speed.json

calibration: $(STAMP)  ## temperature, ECE, Brier and NLL before and after, every run of `make corpora` and the from-scratch BBC run of `make scratch` (~5 min)
	$(BIN)/python -m scripts.calibration --runs reports/corpora-runs reports/bbc --out reports/calibration

label-audit: $(STAMP)  ## docclass audit on BBC with 5, 10 and 20 % of its labels flipped: precision, recall, accuracy won back (~70 min)
	$(BIN)/python -m scripts.label_audit --config configs/bbc.yaml --rates 0.05 0.1 0.2 --out reports/label-audit

planted-keyword: $(STAMP)  ## do the word scores find a planted deciding keyword? tiny model and MiniLM (~15 min)
	$(BIN)/python -m scripts.planted_keyword --out reports/planted-keyword.json

long-documents: $(STAMP)  ## full vs windowed attention, 512 to 8,192 tokens (speed and memory)
	$(BIN)/python -m scripts.long_documents --out reports/long-documents.json

batching-speed: $(STAMP)  ## documents of mixed length: one at a time vs padded batch vs length_batches
	$(BIN)/python -m scripts.batching_speed --ckpt reports/bbc/checkpoints/last.ckpt \
		--out reports/batching-speed.json

serve-load: $(STAMP)  ## 8 clients x 100 requests against `docclass serve`, batching off vs on (after `make scratch`)
	$(BIN)/python -m scripts.serve_load --ckpt reports/bbc/checkpoints/last.ckpt \
		--clients 8 --requests 100 --out reports/serve-load.json

clean:
	rm -rf $(VENV) reports/tiny reports/bbc reports/demo
