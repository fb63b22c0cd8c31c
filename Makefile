# cclkit — build, package, test.
#
#   make run    build everything (release) and run the main job on embedded defaults
#   make test   build, package and run every test (workspace, C header test, symbol checks)
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
# iproute2 for the network-namespace tests.
APT_PACKAGES := libclang1-14 libclang-common-14-dev libfabric-dev libfabric-bin libibverbs-dev iproute2

# Packaging table: cargo cdylib name | kind | installed names (NCCL searches
# libnccl-<kind>-<name>.so; RCCL searches librccl-net-<name>.so for net plugins).
PLUGINS := \
  cclkit_net_socket:net:cclkit-socket \
  cclkit_net_ofi:net:cclkit-ofi \
  cclkit_net_ib:net:cclkit-ib \
  cclkit_tuner:tuner:cclkit \
  cclkit_net_template:net:template \
  cclkit_tuner_template:tuner:template

.PHONY: all deps build package symbols headers test test-rust test-c run clean

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

# Install every cdylib under the names NCCL and RCCL search, after checking its symbols.
package: build
	@mkdir -p $(LIB_DIR)
	@for entry in $(PLUGINS); do \
	  IFS=: read -r crate kind name <<<"$$entry"; \
	  src=$(OUT)/lib$$crate.so; \
	  tests/packaging/check-symbols.sh $$src $$kind >/dev/null || { tests/packaging/check-symbols.sh $$src $$kind; exit 1; }; \
	  install -m 0755 $$src $(LIB_DIR)/libnccl-$$kind-$$name.so; \
	  if [ $$kind = net ]; then install -m 0755 $$src $(LIB_DIR)/librccl-net-$$name.so; fi; \
	done
	@echo "packaged into $(LIB_DIR):"; ls $(LIB_DIR)

symbols: package
	@for entry in $(PLUGINS); do \
	  IFS=: read -r crate kind name <<<"$$entry"; \
	  tests/packaging/check-symbols.sh $(LIB_DIR)/libnccl-$$kind-$$name.so $$kind; \
	  if [ $$kind = net ]; then tests/packaging/check-symbols.sh $(LIB_DIR)/librccl-net-$$name.so net; fi; \
	done

# Regenerate the committed C headers (a test fails when they are stale).
headers:
	CCLKIT_BLESS=1 $(CARGO) test -p cclkit-abi --test headers

test-rust: package
	CCLKIT_LIB_DIR=$(LIB_DIR) $(CARGO) test --workspace --profile $(PROFILE) --no-fail-fast

test-c: package
	CCLKIT_LIB_DIR=$(LIB_DIR) tests/c/run.sh

test: symbols test-rust test-c
	@echo "make test: all passed"

run: package
	@tests/packaging/inventory.sh $(LIB_DIR)

clean:
	rm -rf build
	$(CARGO) clean
