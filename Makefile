# cclkit — build, package, test.
#
#   make run    build everything (release) and run the main job on embedded defaults
#   make test   lint, build, package and run every test (workspace, C tests, symbol checks,
#               PTX assembly check)
#   make        build and package the plugins into build/lib under NCCL/RCCL names
#
# Both `run` and `test` install missing system packages with apt when run as root,
# otherwise they stop and print the exact command to run.

SHELL        := bash
.SHELLFLAGS  := -eu -o pipefail -c
CARGO        ?= cargo
PROFILE      ?= release
TARGET_DIR   := $(shell $(CARGO) metadata --format-version 1 --no-deps 2>/dev/null | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
ifeq ($(TARGET_DIR),)
TARGET_DIR   := target
endif
OUT          := $(TARGET_DIR)/$(PROFILE)
LIB_DIR      := $(CURDIR)/build/lib

# System packages: bindgen's libclang (net-ofi, net-ib), libfabric and verbs headers,
# iproute2 for the network-namespace tests, valgrind for cclkit check's leak check,
# Open MPI for the mpirun launcher test and the MPI comparison benchmark.
APT_PACKAGES := libclang1-14 libclang-common-14-dev libfabric-dev libfabric-bin libibverbs-dev iproute2 valgrind openmpi-bin libopenmpi-dev

# Packaging table: cargo cdylib name | kind | installed names (NCCL searches
# libnccl-<kind>-<name>.so; RCCL searches librccl-net-<name>.so for net plugins).
PLUGINS := \
  cclkit_net_socket:net:cclkit-socket \
  cclkit_net_ofi:net:cclkit-ofi \
  cclkit_net_ib:net:cclkit-ib \
  cclkit_tuner:tuner:cclkit \
  cclkit_env_toml:env:cclkit \
  cclkit_profiler_trace:profiler:cclkit \
  cclkit_net_template:net:template \
  cclkit_net_inline_template:net:inline-template \
  cclkit_tuner_template:tuner:template \
  cclkit_env_template:env:template \
  cclkit_profiler_template:profiler:template

.PHONY: all deps build package symbols headers lint test test-rust test-c run clean

all: package

deps:
	@missing=""; \
	for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "missing system packages:$$missing"; \
	    echo "run: sudo apt-get update && sudo apt-get install -y$$missing"; \
	    exit 1; \
	  fi; \
	fi

build: deps
	$(CARGO) build --workspace --profile $(PROFILE) --lib --bins

# Install every cdylib under the names NCCL and RCCL search, after checking its symbols:
# `cclkit package` (core/cli/src/commands/package.rs), the same code a vendor runs.
package: build cuda-standin
	@mkdir -p $(LIB_DIR)
	@for entry in $(PLUGINS); do \
	  IFS=: read -r crate kind name <<<"$$entry"; \
	  src=$(OUT)/lib$$crate.so; \
	  $(OUT)/cclkit package $$src --kind $$kind --name $$name --dest $(LIB_DIR) --exact --quiet; \
	done
	@echo "packaged into $(LIB_DIR):"; ls $(LIB_DIR)

# The host-memory CUDA stand-in (libcuda.so.1, libcudart.so.12) that `cclkit check|perf|
# doctor|info --cuda-standin` put first on the library path (docs/cuda-standin.md).
.PHONY: cuda-standin
cuda-standin:
	@kernels/cuda-standin/build.sh $(CURDIR)/build/cuda-standin

symbols: package
	@for entry in $(PLUGINS); do \
	  IFS=: read -r crate kind name <<<"$$entry"; \
	  $(OUT)/cclkit package --check-only --exact --kind $$kind $(LIB_DIR)/libnccl-$$kind-$$name.so; \
	  if [ $$kind = net ]; then $(OUT)/cclkit package --check-only --exact --kind net $(LIB_DIR)/librccl-net-$$name.so; fi; \
	done

# Regenerate the committed C headers (a test fails when they are stale).
headers:
	CCLKIT_BLESS=1 $(CARGO) test -p cclkit-abi --test headers

test-rust: package
	CCLKIT_LIB_DIR=$(LIB_DIR) $(CARGO) test --workspace --profile $(PROFILE) --no-fail-fast 2>&1 | tee build/test-rust.log

test-c: package
	CCLKIT_LIB_DIR=$(LIB_DIR) tests/c/run.sh 2>&1 | tee build/test-c.log

# Formatting, clippy and rustdoc with warnings as errors, on every crate and target
# (rustdoc: no broken or private intra-doc links in any crate's public docs).
lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --profile $(PROFILE) -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps --profile $(PROFILE)

# Ends with every ignored or skipped test and its reason (tests/skips.sh).
test: lint symbols test-rust test-c ptx-check
	@tests/skips.sh build/test-rust.log build/test-c.log
	@echo "make test: all passed"

# The main job: nccl-tests' all_reduce_perf on 4 local ranks, 8 B … 64 MiB, on the
# embedded defaults (built-in socket transport, built-in cost-model tuner: plugins
# installed elsewhere are not picked up). At least -n 20 timed iterations per size,
# raised so each timed loop lasts ~400 ms: thousands at 8 B, 20 at 64 MiB. About a
# minute on 2 cores. Exits non-zero if any element is wrong.
RUN_PERF_ARGS ?= --np 4 -b 8 -e 64M -f 2 -n 20 -w 5 --iter-time 400
run: package
	@tests/packaging/inventory.sh $(LIB_DIR)
	NCCL_NET_PLUGIN=none NCCL_TUNER_PLUGIN=none $(OUT)/cclkit perf $(RUN_PERF_ARGS)

# cclkit perf vs Open MPI's MPI_Allreduce over TCP, 2 and 4 local ranks, same sizes
# (core/cli/perf/compare.sh; needs openmpi-bin and libopenmpi-dev).
.PHONY: perf-compare
perf-compare: build
	NCCL_NET_PLUGIN=none NCCL_TUNER_PLUGIN=none core/cli/perf/compare.sh $(OUT)/cclkit

# The same at 8 B, alternated round by round, median of per-round ratios
# (core/cli/perf/compare_small.sh).
.PHONY: perf-compare-small
perf-compare-small: build
	NCCL_NET_PLUGIN=none NCCL_TUNER_PLUGIN=none core/cli/perf/compare_small.sh $(OUT)/cclkit

clean:
	rm -rf build
	$(CARGO) clean

# ---- CUDA kernels (kernels/cuda, docs/cuda.md) -----------------------------------
# `make ptx` regenerates the two committed PTX files from the project's .cu sources with
# clang (no CUDA toolkit: -nocudainc -nocudalib): sm_80 with clang-14 (JIT-compiled
# forward by the driver on any later GPU), and sm_90 with clang-16 (Hopper and later:
# the hardware's fp8 conversions; the loader picks it on compute capability 9.0+).
# `make ptx-check` assembles them with NVIDIA's ptxas (from the nvidia-cuda-nvcc-cu12
# wheel on PyPI, no GPU needed), sm_80 PTX for sm_80 and sm_90, sm_90 PTX for sm_90,
# and, for each whose clang is installed, checks that the committed file matches its
# sources.
PTX_CLANG   ?= clang-14
PTX_ARCH    ?= sm_80
PTX_SRC     := kernels/cuda/cclkit_kernels.cu
PTX_OUT     := kernels/cuda/cclkit_kernels.ptx
PTX_FLAGS   = -x cuda --cuda-device-only --cuda-gpu-arch=$(PTX_ARCH) -nocudainc -nocudalib \
               -O3 -std=c++17 -ffp-contract=off -S
PTX_HEADER  = // cclkit: generated by `make ptx` from $(PTX_SRC) ($(PTX_CLANG), $(PTX_ARCH)); do not edit.
PTX90_CLANG ?= clang-16
PTX90_OUT   := kernels/cuda/cclkit_kernels_sm90.ptx
# Every committed PTX file as clang:target:file (`ptx` and `ptx-check` walk it).
PTX_BUILDS  := $(PTX_CLANG):sm_80:$(PTX_OUT) $(PTX90_CLANG):sm_90:$(PTX90_OUT)
PTXAS_WHEEL ?= nvidia-cuda-nvcc-cu12==12.9.86
PTXAS_DIR   := $(CURDIR)/build/ptxas
PTXAS       := $(PTXAS_DIR)/nvidia/cuda_nvcc/bin/ptxas

.PHONY: ptx ptx-check

# Generates the PTX into $(1).
define ptx_gen
	$(PTX_CLANG) $(PTX_FLAGS) -o $(1).body $(PTX_SRC)
	{ echo '$(PTX_HEADER)'; cat $(1).body; } > $(1)
	rm -f $(1).body
endef

ptx:
	@set -e; for b in $(PTX_BUILDS); do set -- $$(echo $$b | tr : ' '); \
	  command -v $$1 >/dev/null || { \
	    if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$1 >/dev/null; \
	    else echo "$$1 not found; run: sudo apt-get install -y $$1"; exit 1; fi; }; \
	  $(MAKE) --no-print-directory PTX_CLANG=$$1 PTX_ARCH=$$2 PTX_OUT=$$3 ptx-regen; \
	  echo "wrote $$3: $$(grep -c '^.visible .entry' $$3) entry points"; \
	done

ptx-check:
	@test -x $(PTXAS) || { \
	  mkdir -p $(PTXAS_DIR) && \
	  python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
	    -d $(PTXAS_DIR) '$(PTXAS_WHEEL)' && \
	  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("nvidia/cuda_nvcc/bin/ptxas", sys.argv[2])' \
	    $(PTXAS_DIR)/nvidia_cuda_nvcc_cu12-*.whl $(PTXAS_DIR) && \
	  rm -f $(PTXAS_DIR)/nvidia_cuda_nvcc_cu12-*.whl && chmod +x $(PTXAS); }
	$(PTXAS) --version | tail -1
	@set -e; for b in $(PTX_BUILDS); do set -- $$(echo $$b | tr : ' '); \
	  for arch in $$(echo $$2 sm_90 | tr ' ' '\n' | sort -u); do \
	    cubin=$(PTXAS_DIR)/$$(basename $$3 .ptx).$$arch.cubin; \
	    $(PTXAS) -arch=$$arch $$3 -o $$cubin; \
	    echo "ptxas -arch=$$arch $$3: ok ($$(stat -c %s $$cubin) bytes)"; \
	  done; \
	done
	@set -e; for b in $(PTX_BUILDS); do set -- $$(echo $$b | tr : ' '); \
	  if command -v $$1 >/dev/null; then \
	    $(MAKE) --no-print-directory PTX_CLANG=$$1 PTX_ARCH=$$2 PTX_OUT=$(PTXAS_DIR)/fresh.ptx ptx-regen >/dev/null && \
	    if cmp -s $(PTXAS_DIR)/fresh.ptx $$3; then echo "$$3 is up to date with its sources"; \
	    else echo "$$3 is stale: run make ptx and commit it"; exit 1; fi; \
	  else echo "$$1 not installed: skipped the staleness check of $$3 (make ptx installs it)"; fi; \
	done

.PHONY: ptx-regen
ptx-regen:
	$(call ptx_gen,$(PTX_OUT))

# Start a plugin of your own, outside this repository: `cclkit new net|tuner NAME`
# (docs/vendor-net-plugin.md). `make new-plugin KIND=.. NAME=..` runs it against this
# checkout's cclkit-abi and writes ./nccl-KIND-NAME (a standalone crate, not a member).
.PHONY: new-plugin
new-plugin: build
	$(OUT)/cclkit new "$(KIND)" "$(NAME)" --sdk path:$(CURDIR)
