# knext: containerd v2 + NRI, built from pinned upstream modules plus patches/<module>/.
# Every go command runs in the workspace build/go.work (this repo + the patched trees).

SHELL := /bin/bash
BUILD := $(CURDIR)/build
BIN := $(BUILD)/bin
export GOWORK := $(BUILD)/go.work
export GOFLAGS := -buildvcs=false
export PATH := /usr/local/go/bin:$(PATH)
# Code generators are built once and shared by every materialization (make src, verify).
export KNEXT_TOOLS_DIR := $(BUILD)/tools

CONTAINERD_MOD := github.com/containerd/containerd/v2
UPSTREAM_VERSION = $(shell GOWORK=off go list -m -f '{{.Version}}' $(CONTAINERD_MOD))
REVISION = $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
VERSION_PKG := $(CONTAINERD_MOD)/version
LDFLAGS = -X $(VERSION_PKG).Package=github.com/knext-dev/knext \
	-X $(VERSION_PKG).Version=$(UPSTREAM_VERSION)+knext.$(REVISION) \
	-X $(VERSION_PKG).Revision=$(REVISION)
# Upstream's own tags: no man-page generator in the daemon; the shim without gRPC.
GO_TAGS := urfave_cli_no_docs
SHIM_TAGS := urfave_cli_no_docs no_grpc

SRC_STAMP := $(BUILD)/src/.stamp
PATCHES := $(wildcard patches/*/*.patch)

IMAGES := $(BUILD)/images
# Pristine upstream containerd (no patches), for compatibility tests and the benchmark baseline.
UPSTREAM_BIN := $(BUILD)/upstream/bin
export KNEXT_UPSTREAM_BIN_DIR := $(UPSTREAM_BIN)
# Where the integration harness and the demo find knext's binaries and the test images.
export KNEXT_BIN_DIR := $(BIN)
export KNEXT_IMAGES_DIR := $(IMAGES)

.PHONY: all src build upstream images demo test integration bench patches verify verify-proto clean
all: build

src: $(SRC_STAMP)
$(SRC_STAMP): go.mod $(PATCHES) $(wildcard contrib/build/*.sh)
	@contrib/build/src.sh $(BUILD)
	@touch $@

build: src
	go build -tags "$(GO_TAGS)" -ldflags "$(LDFLAGS)" -o $(BIN)/containerd ./cmd/containerd
	CGO_ENABLED=0 go build -tags "$(SHIM_TAGS)" -ldflags "$(LDFLAGS)" -o $(BIN)/containerd-shim-runc-v2 $(CONTAINERD_MOD)/cmd/containerd-shim-runc-v2
	go build -tags "$(GO_TAGS)" -ldflags "$(LDFLAGS)" -o $(BIN)/ctr $(CONTAINERD_MOD)/cmd/ctr
	go build -o $(BIN)/nri-bridge ./cmd/nri-bridge

upstream:
	@dir=$$(GOWORK=off go mod download -json $(CONTAINERD_MOD)@$(UPSTREAM_VERSION) | sed -n 's/^\t"Dir": "\(.*\)",$$/\1/p'); \
	GOWORK=off go build -C $$dir -tags "$(GO_TAGS)" -o $(UPSTREAM_BIN)/containerd ./cmd/containerd && \
	GOWORK=off CGO_ENABLED=0 go build -C $$dir -tags "$(SHIM_TAGS)" -o $(UPSTREAM_BIN)/containerd-shim-runc-v2 ./cmd/containerd-shim-runc-v2

# Test images (contrib/images/testimages): knext.local/pause:3.10, knext.local/busybox:1.35.
images:
	CGO_ENABLED=0 go build -trimpath -ldflags=-s -o $(IMAGES)/pause ./contrib/images/pause
	go run ./contrib/images -pause-binary $(IMAGES)/pause -busybox /bin/busybox -out $(IMAGES)

# The README's run command: a real pod on a self-contained knext containerd under build/demo.
demo: build images
	@contrib/ci/check-deps.sh
	go build -o $(BIN)/knext-demo ./contrib/demo
	$(BIN)/knext-demo -root $(BUILD)/demo

integration: build upstream images
	go test -race -count=1 -p 2 ./integration/...

# The README's test command: every suite, counted per suite (contrib/ci/test.sh).
test: build upstream images
	@contrib/ci/check-deps.sh
	@contrib/build/verify.sh
	@contrib/build/verify-proto.sh
	@contrib/ci/lint.sh
	go build -o $(BIN)/testsum ./contrib/ci/testsum
	@contrib/ci/test.sh

BENCH := $(BUILD)/bench
# knext against upstream containerd, in one run (docs/performance.md): PodSandboxStatus cost, pod
# lifecycle with CNI and CNI-less, scale. Not part of `make test`. Tune it with BENCH_FLAGS, e.g.
# BENCH_FLAGS="-repeats 3 -benchmarks lifecycle".
bench: build upstream images
	@contrib/ci/check-deps.sh
	go build -o $(BENCH)/knext-bench ./contrib/bench
	go build -o $(BENCH)/statusplugin ./contrib/bench/statusplugin
	go build -o $(BENCH)/cnitrace ./contrib/bench/cnitrace
	$(BENCH)/knext-bench -knext $(BIN)/containerd -upstream $(UPSTREAM_BIN)/containerd \
		-plugin $(BENCH)/statusplugin -nri-bridge $(BIN)/nri-bridge -cnitrace $(BENCH)/cnitrace \
		-out $(BENCH)/report.json $(BENCH_FLAGS)

patches:
	@contrib/build/export.sh $(BUILD) patches

verify:
	@contrib/build/verify.sh

# Regenerating upstream's own proto reproduces its generated files; materializing is deterministic.
verify-proto:
	@contrib/build/verify-proto.sh

clean:
	rm -rf $(BUILD)
