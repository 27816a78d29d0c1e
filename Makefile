# Each target sets up .venv on its own; a second run takes seconds (stamp files).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PYSTAMP := $(VENV)/.stamp-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
# The native part (native/: the simulator's event kernel in Rust, PyO3 + maturin), rebuilt when its
# sources change. Every target below depends on STAMP, so on both.
NATIVE_SRC := native/Cargo.toml native/Cargo.lock native/pyproject.toml $(sort $(wildcard native/src/*.rs))
STAMP := $(VENV)/.native-$(shell cat $(NATIVE_SRC) | cksum | cut -d' ' -f1)
export PATH := $(HOME)/.cargo/bin:$(PATH)

.PHONY: first-run-results browser dashboard-screenshots accel-results demo test bench check setup clean test-gpu bench-gpu demo-gpu gpu-tier results cluster-day scale-results dedup-results keepalive-results autoscale-results overload-results overload-ab-results pool-decisions-ab-results overload-retry-ab-results overload-gateway-ab-results isolation-ab-results ray-serve-results profile-results cluster-results pull-results heap-results

$(PYSTAMP): pyproject.toml
	@echo "setting up $(VENV): gfaas and its test dependencies (first time: 1-2 minutes, about 1 GB; then seconds)"
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --upgrade pip
	@$(BIN)/python -m pip install -q --progress-bar off -e '.[dev]'
	@rm -f $(VENV)/.stamp-[0-9]*; touch $@
	@echo "$(VENV) is ready ($$(du -sh $(VENV) | cut -f1))"

# Without cargo the simulator runs its pure-Python kernel (the same events, slower): a warning, not a
# failure. A build that fails is one.
$(STAMP): $(PYSTAMP) $(NATIVE_SRC)
	@if command -v cargo > /dev/null; then \
	  echo "building gfaas_native (Rust: the simulator's event kernel, fluid network and router; the first time about 30 s)"; \
	  $(BIN)/python -m pip install -q --progress-bar off ./native && rm -f $(VENV)/.native-* && touch $@; \
	else \
	  echo "warning: cargo not found, so gfaas_native is not built and the simulator runs its pure-Python kernel (slower); install Rust (https://rustup.rs) and run make setup again" >&2; \
	fi

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/gfaas demo

# The suite in two phases: most tests on TEST_WORKERS workers at once, then, one at a time, those that
# measure ratios of times or use what the whole machine shares (tests/conftest.py: EXCLUSIVE,
# MACHINE_WIDE); then the 20 slowest tests of both. Either phase failing fails the target.
TEST_WORKERS ?= 3
test: $(STAMP) browser
	@d=$$(mktemp -d); rc=0; \
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not serial and not xdist_group" --junitxml=$$d/1-parallel.xml tests || rc=$$?; \
	$(BIN)/python -m pytest -q -m "serial or xdist_group" --junitxml=$$d/2-serial.xml tests || rc=$$?; \
	$(BIN)/python scripts/test_summary.py $$d --top 20; rm -rf $$d; exit $$rc

# Chromium and its WebDriver for the dashboard's browser tests (tests/browser): installed with apt
# when missing and this is root on Debian; otherwise those tests skip, naming what is missing.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && echo "installing chromium and chromium-driver (apt) for the browser tests" && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) >/dev/null 2>&1; } \
	  || echo "make: chromium or chromedriver missing and not installable here; the browser tests will skip"

# The dashboard's screenshots in docs/ (headless chromium; a workload runs while they are taken) and its
# first-paint times, benchmarks/results/dashboard-cpu.json.
dashboard-screenshots: $(STAMP) browser
	$(BIN)/python scripts/dashboard_screenshots.py docs --json $(R)/dashboard-cpu.json

bench: $(STAMP)
	$(BIN)/gfaas bench dataplane

# GPU tier (needs a CUDA GPU): the CUDA backend's tests; the GPU rows of the data-plane benchmark and
# the h100-x1 calibration drawn from them. No venv and no CuPy install: scripts/gpu_env.py runs them with
# the Python that already imports cupy (.venv's, else the system's with PYTHONPATH=src) and installs only
# carried wheels (.whl/, e.g. msgspec) on a machine without a package index. See docs/benchmarks.md.
test-gpu:
	$(PY) scripts/gpu_env.py test

bench-gpu:
	$(PY) scripts/gpu_env.py bench

# gfaas demo --gpu on the GPU machine as it is (docs/gpu.md): -> benchmarks/results/demo-gpu.json
demo-gpu:
	$(PY) scripts/gpu_env.py demo

# The three above in one command within 540 s (--budget-s): each stage killed past its share, failures
# printed as they happen, a summary after each stage in $OUT/gpu-tier.json (else out/)
# and the result files copied into $OUT (docs/gpu.md). `scripts/gpu_env.py all --dry-run` shows the plan.
gpu-tier:
	$(PY) scripts/gpu_env.py all

# Every committed result file, regenerated at the current commit (commit first: each file records the
# commit it measured and refuses nothing, but tests/unit/test_results_provenance.py fails on a dirty
# tree), then the doc tables generated from them. About 20 minutes on 2 cores; run it on a quiet machine.
R := benchmarks/results
results: $(STAMP)
	@git diff --quiet -- src native benchmarks/*.py || { echo "make results: commit your changes first (results record the commit)"; exit 1; }
	$(BIN)/gfaas bench dataplane --json --out $(R)/dataplane-cpu.json > /dev/null
	$(BIN)/python benchmarks/machine_probes.py --try-shmem-thp --json $(R)/machine-probes-cpu.json > /dev/null
	$(BIN)/python benchmarks/pool_alloc.py --json $(R)/pool-alloc-cpu.json
	$(BIN)/python benchmarks/eviction_blocking.py --samples 200 --json $(R)/eviction-blocking-cpu.json
	$(BIN)/python benchmarks/seal_writes.py --json $(R)/seal-writes-cpu.json > /dev/null
	$(BIN)/python benchmarks/snapshot_cost.py --out $(R)/snapshot-cost-cpu.json > /dev/null
	$(BIN)/gfaas bench sim --json --out $(R)/sim-cpu.json > /dev/null
	$(BIN)/gfaas bench simscale --json --out $(R)/simscale-cpu.json > /dev/null
	$(BIN)/gfaas sim run all --save $(R)/sim-experiments.json > /dev/null
	$(BIN)/gfaas demo --out out/demo --json > $(R)/demo-cpu.json
	$(BIN)/python benchmarks/dataplane_tables.py $(R)/dataplane-cpu.json --write docs/benchmarks.md
	$(BIN)/python benchmarks/sim_tables.py $(R)/sim-experiments.json --write docs/results/README.md
	$(BIN)/python benchmarks/simbench_table.py $(R)/sim-cpu.json --write docs/benchmarks.md \
	  --simscale $(R)/simscale-cpu.json --native-page docs/design/native-core.md
	$(BIN)/python benchmarks/readme_tables.py --write README.md

# What a newcomer's first run costs (about 12 minutes; not in `results`): a fresh clone's make setup,
# gfaas demo --scale small and make demo, with no pip cache and an empty model cache; the README's
# quick start quotes it.
first-run-results: $(STAMP)
	@git diff --quiet -- src native benchmarks/*.py || { echo "make first-run-results: commit your changes first (results record the commit)"; exit 1; }
	$(BIN)/python benchmarks/first_run.py --json $(R)/first-run-cpu.json > /dev/null
	$(BIN)/python benchmarks/readme_tables.py --write README.md

# The cluster-scale experiment on its own (not in `sim run all` or `results`: ~10 minutes at full
# size): its result file, the figure docs/results/cluster-day.png and the block of docs/results/cluster-day.md.
cluster-day: $(STAMP)
	@git diff --quiet -- src native benchmarks/*.py || { echo "make cluster-day: commit your changes first (results record the commit)"; exit 1; }
	$(BIN)/gfaas sim run cluster-day --save $(R)/cluster-day.json --out out/cluster-day
	cp out/cluster-day/cluster-day.png docs/results/cluster-day.png
	$(BIN)/python benchmarks/sim_tables.py $(R)/cluster-day.json --write docs/results/cluster-day.md

# The in-storage accelerator (not in `results`: SCALE-Sim alone runs ~10-15 minutes): the SCALE-Sim
# comparison, the design-space exploration and the DSCS serverless experiments, with their pages.
DSCS_EXPERIMENTS = dscs-platforms,dscs-batch,dscs-tail,dscs-functions,dscs-cold,dscs-rack
accel-results: $(STAMP)
	@git diff --quiet -- src native benchmarks/*.py || { echo "make accel-results: commit your changes first (results record the commit)"; exit 1; }
	$(BIN)/gfaas bench accel --json --out $(R)/accel-scalesim.json > /dev/null
	$(BIN)/gfaas accel dse --out out/accel-dse --json > $(R)/accel-dse.json
	cp out/accel-dse/dse_frontiers.png docs/accel-dse.png
	$(BIN)/gfaas sim run $(DSCS_EXPERIMENTS) --save $(R)/dscs-experiments.json --out out/dscs > /dev/null
	cp out/dscs/dscs-platforms.png out/dscs/dscs-rack.png docs/results/
	$(BIN)/python benchmarks/sim_tables.py $(R)/dscs-experiments.json --write docs/results/dscs.md
	$(BIN)/python benchmarks/accel_emulation.py --json $(R)/accel-emulation.json
	$(BIN)/python benchmarks/accel_tables.py $(R)/accel-scalesim.json $(R)/accel-dse.json $(R)/accel-emulation.json --write docs/accel.md

# Real scaling in rate-limited network namespaces (root; ~45 s; not in `results`): the result file,
# the figure docs/scaling-ramp.png and the Measured block of docs/scaling.md.
scale-results: $(STAMP)
	@[ "$$(id -u)" = 0 ] || { echo "make scale-results: network namespaces need root; run: sudo make scale-results"; exit 2; }
	@git diff --quiet -- src native benchmarks/*.py || { echo "make scale-results: commit your changes first (results record the commit)"; exit 1; }
	$(BIN)/gfaas bench scale --json --out $(R)/scale-netns.json --figure docs/scaling-ramp.png > /dev/null
	$(BIN)/python benchmarks/scale_tables.py $(R)/scale-netns.json --write docs/scaling.md

# Page merging (root: it bursts KSM and reads other processes' memory; ~5 minutes; not in `results`):
# the result file, the figure docs/dedup.png and the generated tables of docs/dedup.md.
dedup-results: $(STAMP)
	@[ "$$(id -u)" = 0 ] || { echo "make dedup-results: KSM and other processes' memory need root; run: sudo make dedup-results"; exit 2; }
	@git diff --quiet -- src native benchmarks/*.py || { echo "make dedup-results: commit your changes first (results record the commit)"; exit 1; }
	$(BIN)/gfaas bench dedup --json --out $(R)/dedup.json --figure docs/dedup.png > /dev/null
	$(BIN)/python benchmarks/dedup_tables.py $(R)/dedup.json --write docs/dedup.md

check: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/mypy
	@if command -v cargo > /dev/null; then \
	  cd native && cargo fmt --check && cargo clippy -q --release -- -D warnings; \
	else echo "warning: cargo not found: native/ not checked" >&2; fi

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache native/target

# The keep-alive simulator's result (one synthetic day of 10,000 functions; about a minute on 2 cores) and
# its Pareto figure, quoted by docs/autoscaling.md.
keepalive-results: $(STAMP)
	@git diff --quiet -- src native benchmarks/*.py || { echo "make keepalive-results: commit your changes first (results record the commit)"; exit 1; }
	$(BIN)/gfaas sim keepalive --policies fixed:10,fixed:60,hybrid,gfaas,gfaas:300 --json \
		--out $(R)/keepalive.json --figure docs/autoscaling.png > /dev/null

# Scaling on the real runtime (about 13 minutes on 2 cores; not in `results`): worker starts, a burst at zero
# workers, then three runs of bursty arrivals under
# always-warm, fixed:1 and gfaas, and the simulator's replay of the same arrivals (docs/autoscaling.md).
autoscale-results: $(STAMP)
	@git diff --quiet -- src native benchmarks/*.py || { echo "make autoscale-results: commit your changes first (results record the commit)"; exit 1; }
	$(BIN)/gfaas bench autoscale --runs 3 --json --out $(R)/autoscale.json > /dev/null
	$(BIN)/python benchmarks/autoscale_tables.py $(R)/autoscale.json --write docs/autoscaling.md

# The hot path under overload (about 12 minutes; not in `results`): gfaas serve driven with 16, 256 and
# 2,000 connections in three rounds (forward, backward, forward: each count's median goodput), the pipe
# floor and the embedded invocation, and the blocks of docs/performance.md. Three times: refused clients
# back after at most 1 s (the harder case), clients that wait the whole Retry-After the server asks (up
# to 30 s), and clients that retry at once.
# The pipeline against Ray Serve (about 2 minutes; needs the ray extra): issue 23's 64 MiB target.
# goodput of this checkout against the commit before the one-message-per-step runtime, interleaved (about 5 min)
# Issue 37's changes against the commit before them, in the same minutes (about 6 minutes): the
# device pool's allocation and the data plane, interleaved A/B (benchmarks/ab_*.py).
ISOLATION_AB_BASE := 8cc1143
isolation-ab-results: $(STAMP)
	@git diff --quiet -- src native benchmarks/*.py || { echo "make isolation-ab-results: commit your changes first (results record the commit)"; exit 1; }
	$(BIN)/python benchmarks/ab_pool_alloc.py --base $(ISOLATION_AB_BASE) --pairs 7 --json $(R)/pool-alloc-ab-issue37-cpu.json
	$(BIN)/python benchmarks/ab_dataplane.py --base $(ISOLATION_AB_BASE) --pairs 6 --json $(R)/dataplane-ab-issue37-cpu.json

OVERLOAD_AB_BASE := 75b7b63
# Retry-After that counts the clients already told to come back, against the commit before it: clients
# that honour it, 16 and 2,000 connections, interleaved (about 7 minutes)
RETRY_AB_BASE := b878c4f
overload-retry-ab-results: $(STAMP)
	@git diff --quiet -- src native benchmarks/*.py || { echo "make overload-retry-ab-results: commit your changes first (results record the commit)"; exit 1; }
	$(BIN)/python benchmarks/ab_overload.py --base $(RETRY_AB_BASE) --pairs 3 --connections 16,2000 --retry-after-cap 30 --json $(R)/overload-retry-ab.json

# This round's gateway changes together (replies polled between connections, Retry-After counting the
# clients already told to come back) against the commit before them, clients honouring Retry-After
SESSION_AB_BASE := 989d9b1
overload-gateway-ab-results: $(STAMP)
	@git diff --quiet -- src native benchmarks/*.py || { echo "make overload-gateway-ab-results: commit your changes first (results record the commit)"; exit 1; }
	$(BIN)/python benchmarks/ab_overload.py --base $(SESSION_AB_BASE) --pairs 3 --connections 16,2000 --retry-after-cap 30 --json $(R)/overload-gateway-ab.json

# No pool decision at max workers with none idle (issue 35), against the commit before it, interleaved:
# gfaas serve's goodput at 16, 256 and 2,000 connections with clients that retry at once, embedded
# invocations with 16 and 256 in flight, and goodput with clients that honour Retry-After (about 15 minutes)
POOL_DECISIONS_AB_BASE := d5e95c5
pool-decisions-ab-results: $(STAMP)
	@git diff --quiet -- src native benchmarks/*.py || { echo "make pool-decisions-ab-results: commit your changes first (results record the commit)"; exit 1; }
	$(BIN)/python benchmarks/ab_overload.py --base $(POOL_DECISIONS_AB_BASE) --pairs 2 --connections 16,256,2000 --retry-after-cap 0 --json $(R)/pool-decisions-ab.json
	$(BIN)/python benchmarks/ab_queued.py --base $(POOL_DECISIONS_AB_BASE) --pairs 4 --concurrency 16,256 --json $(R)/queued-ab.json
	$(BIN)/python benchmarks/ab_overload.py --base $(POOL_DECISIONS_AB_BASE) --pairs 2 --connections 16,2000 --retry-after-cap 30 --json $(R)/pool-decisions-ab-honoured.json

overload-ab-results: $(STAMP)
	@git diff --quiet -- src native benchmarks/*.py || { echo "make overload-ab-results: commit your changes first (results record the commit)"; exit 1; }
	$(BIN)/python benchmarks/ab_overload.py --base $(OVERLOAD_AB_BASE) --pairs 3 --json $(R)/overload-ab.json
	$(BIN)/python benchmarks/overload_tables.py $(R)/overload-ab.json --block overload-ab --write docs/performance.md

ray-serve-results: $(STAMP)
	@git diff --quiet -- src native benchmarks/*.py || { echo "make ray-serve-results: commit your changes first (results record the commit)"; exit 1; }
	$(BIN)/python -m pip install -q -e '.[dev,ray]'
	$(BIN)/gfaas bench ray-serve --json --out $(R)/ray-serve.json > /dev/null
	$(BIN)/python benchmarks/hotpath_tables.py $(R)/ray-serve.json --block ray-serve --write docs/performance.md

# Data passing between machines and the workflows end to end on a lab of network namespaces (root; about
# 2 minutes; needs the ray extra; not in `results`): gfaas vs Redis vs Ray's object store (issue 20).
cluster-results: $(STAMP)
	@[ "$$(id -u)" = 0 ] || { echo "make cluster-results: network namespaces need root; run: sudo make cluster-results"; exit 2; }
	@git diff --quiet -- src native benchmarks/*.py || { echo "make cluster-results: commit your changes first (results record the commit)"; exit 1; }
	$(BIN)/python -m pip install -q -e '.[dev,ray]'
	$(BIN)/gfaas bench cluster --json --out $(R)/cluster-cpu.json > /dev/null
	$(BIN)/python benchmarks/cluster_tables.py $(R)/cluster-cpu.json --write docs/deploy.md

# A pull between two machines of a Ray-less lab against one raw TCP stream and Mooncake's transfer engine
# (root; about a minute, plus the engine's wheel the first time, in .venv-te): docs/deploy.md's pull block.
PULL_ENGINE := mooncake-transfer-engine-non-cuda==0.3.13.post1
pull-results: $(STAMP)
	@[ "$$(id -u)" = 0 ] || { echo "make pull-results: network namespaces need root; run: sudo make pull-results"; exit 2; }
	@git diff --quiet -- src native benchmarks/*.py || { echo "make pull-results: commit your changes first (results record the commit)"; exit 1; }
	@ldconfig -p | grep -q librdmacm.so.1 || { apt-get update -q && apt-get install -y -q libibverbs1 librdmacm1; }
	@[ -x .venv-te/bin/python ] || { python3 -m venv .venv-te && .venv-te/bin/pip install -q '$(PULL_ENGINE)'; }
	$(BIN)/gfaas bench pull --json --engine-python .venv-te/bin/python --out $(R)/pull-cpu.json > /dev/null
	$(BIN)/python benchmarks/pull_tables.py $(R)/pull-cpu.json --write docs/deploy.md

# Warm heaps both ways (RuntimeConfig.worker_heap), alternating (about 3 minutes): docs/performance.md's
# "Warm heaps" paragraph quotes benchmarks/results/heap-cpu.json.
heap-results: $(STAMP)
	@git diff --quiet -- src native benchmarks/*.py || { echo "make heap-results: commit your changes first (results record the commit)"; exit 1; }
	$(BIN)/python benchmarks/heap_ab.py --pairs 2 --invocations 6 --json $(R)/heap-cpu.json

# The embedded invocation's profile after issue 23's work: docs/perf-after.svg (py-spy, all processes)
# and benchmarks/results/profile-after-cpu.json (p50 and CPU per process), quoted by docs/performance.md.
profile-results: $(STAMP)
	@git diff --quiet -- src native benchmarks/*.py || { echo "make profile-results: commit your changes first (results record the commit)"; exit 1; }
	$(BIN)/python -m pip install -q py-spy
	$(BIN)/py-spy record --rate 250 --function --subprocesses -o docs/perf-after.svg -- \
		$(BIN)/python benchmarks/profile_invoke.py loop --n 1500 > /dev/null
	$(BIN)/python benchmarks/profile_invoke.py loop --n 1000 --out $(R)/profile-after-cpu.json > /dev/null
	$(BIN)/python benchmarks/hotpath_tables.py $(R)/profile-after-cpu.json --block profile-after --write docs/performance.md
	$(BIN)/python benchmarks/profile_invoke.py timeline --n 1000 --out $(R)/profile-timeline-cpu.json > /dev/null
	$(BIN)/python benchmarks/hotpath_tables.py $(R)/profile-timeline-cpu.json --block timeline --write docs/performance.md
	$(BIN)/python benchmarks/hotpath_tables.py $(R)/profile-after-cpu.json --block control-path --write docs/performance.md
	$(BIN)/python benchmarks/profile_invoke.py lean --n 2000 --out $(R)/profile-lean-cpu.json > /dev/null
	$(BIN)/python benchmarks/hotpath_tables.py $(R)/profile-lean-cpu.json --block lean --write docs/performance.md

overload-results: $(STAMP)
	@git diff --quiet -- src native benchmarks/*.py || { echo "make overload-results: commit your changes first (results record the commit)"; exit 1; }
	$(BIN)/gfaas bench overload --json --rounds 3 --out $(R)/overload.json > /dev/null
	$(BIN)/gfaas bench overload --json --rounds 3 --retry-after-cap 30 --out $(R)/overload-honoured.json > /dev/null
	$(BIN)/gfaas bench overload --json --rounds 3 --retry-after-cap 0 --out $(R)/overload-at-once.json > /dev/null
	$(BIN)/python benchmarks/overload_tables.py $(R)/overload.json --write docs/performance.md
	$(BIN)/python benchmarks/overload_tables.py $(R)/overload-honoured.json --block overload-honoured --write docs/performance.md
	$(BIN)/python benchmarks/overload_tables.py $(R)/overload-at-once.json --block overload-at-once --write docs/performance.md
