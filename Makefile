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
VERSION = $(UPSTREAM_VERSION)+knext.$(REVISION)
# Image tags and file names cannot hold the '+': v2.4.2+knext.<revision> is tagged v2.4.2-knext.<revision>.
TAG = $(subst +,-,$(VERSION))
LDFLAGS = -X $(VERSION_PKG).Package=github.com/knext-dev/knext \
	-X $(VERSION_PKG).Version=$(VERSION) \
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

# Kubernetes (the kubelet of the kubelet end-to-end suite, and every component of `make cluster`),
# pinned in third_party/kubernetes/go.mod and cached by version; etcd (third_party/etcd) and CoreDNS
# (third_party/coredns) likewise.
KUBERNETES_COMMANDS := kubelet kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubectl
export KNEXT_KUBELET := $(shell third_party/kubernetes/build.sh -path $(BUILD)/kubernetes)
export KNEXT_KUBERNETES_DIR := $(dir $(KNEXT_KUBELET))
ETCD_TOOL := third_party/etcd go.etcd.io/etcd/server/v3 $(BUILD)/etcd etcd=go.etcd.io/etcd/server/v3
export KNEXT_ETCD := $(shell script/build/gotools.sh -path $(ETCD_TOOL))
COREDNS_TOOL := third_party/coredns github.com/coredns/coredns $(BUILD)/coredns coredns=github.com/knext-dev/knext/third_party/coredns
COREDNS := $(shell script/build/gotools.sh -path $(COREDNS_TOOL))
# The cluster's state (make cluster, make cluster-down) and nri-bridge's manifest it applies.
CLUSTER_DIR := $(BUILD)/cluster
NODES ?= 2
RUNTIME ?= knext
# kube-proxy's mode on the nodes: nftables or iptables.
PROXY_MODE ?= nftables
export KNEXT_CLUSTER_PROXY_MODE := $(PROXY_MODE)
export KNEXT_NRI_BRIDGE_MANIFEST := $(CURDIR)/deploy/nri-bridge/daemonset.yaml
# `make release`'s tarball (deploy/release), which a test unpacks and runs the demo from.
RELEASE_DIR := $(BUILD)/release
export KNEXT_RELEASE := $(RELEASE_DIR)/knext-$(TAG)-linux-$(shell go env GOARCH).tar.gz

.PHONY: upstream-check all src build upstream images kubelet cluster-tools cluster-images cluster cluster-down release demo test \
	integration bench bench-cluster bench-doc conformance k8s-conformance k8s-conformance-subset patches verify verify-proto verify-series upstream-branches upstream-ci clean
all: build

src: $(SRC_STAMP)
$(SRC_STAMP): go.mod $(PATCHES) $(wildcard script/build/*.sh)
	@script/build/src.sh $(BUILD)
	@touch $@

# nri-bridge is static: the same binary runs on the host and in nri-bridge's image.
build: src
	go build -tags "$(GO_TAGS)" -ldflags "$(LDFLAGS)" -o $(BIN)/containerd ./cmd/containerd
	CGO_ENABLED=0 go build -tags "$(SHIM_TAGS)" -ldflags "$(LDFLAGS)" -o $(BIN)/containerd-shim-runc-v2 $(CONTAINERD_MOD)/cmd/containerd-shim-runc-v2
	go build -tags "$(GO_TAGS)" -ldflags "$(LDFLAGS)" -o $(BIN)/ctr $(CONTAINERD_MOD)/cmd/ctr
	CGO_ENABLED=0 go build -o $(BIN)/nri-bridge ./cmd/nri-bridge

upstream:
	@dir=$$(GOWORK=off go mod download -json $(CONTAINERD_MOD)@$(UPSTREAM_VERSION) | sed -n 's/^\t"Dir": "\(.*\)",$$/\1/p'); \
	GOWORK=off go build -C $$dir -tags "$(GO_TAGS)" -o $(UPSTREAM_BIN)/containerd ./cmd/containerd && \
	GOWORK=off CGO_ENABLED=0 go build -C $$dir -tags "$(SHIM_TAGS)" -o $(UPSTREAM_BIN)/containerd-shim-runc-v2 ./cmd/containerd-shim-runc-v2

# Image archives (internal/ociimage): the test images knext.local/pause:3.10 and
# knext.local/busybox:1.35, and nri-bridge's image knext.local/nri-bridge:$(TAG).
images: build
	CGO_ENABLED=0 go build -trimpath -ldflags=-s -o $(IMAGES)/pause ./internal/ociimage/pause
	go run ./cmd/knext-images -pause-binary $(IMAGES)/pause -busybox /bin/busybox \
		-nri-bridge-binary $(BIN)/nri-bridge -nri-bridge-image knext.local/nri-bridge:$(TAG) -out $(IMAGES)

# Builds the pinned kubelet from the Go module proxy unless $(KNEXT_KUBELET) is already there.
kubelet:
	@third_party/kubernetes/build.sh $(BUILD)/kubernetes >/dev/null

# Every component of the cluster, each built from the Go module proxy once per pinned version.
cluster-tools:
	@third_party/kubernetes/build.sh $(BUILD)/kubernetes $(KUBERNETES_COMMANDS) >/dev/null
	@script/build/gotools.sh $(ETCD_TOOL) >/dev/null
	@script/build/gotools.sh $(COREDNS_TOOL) >/dev/null

# The cluster's own images: CoreDNS (tagged with its version) and the test workloads' netcheck.
cluster-images: cluster-tools
	CGO_ENABLED=0 go build -trimpath -ldflags=-s -o $(IMAGES)/netcheck ./internal/cluster/netcheck
	go run ./cmd/knext-images -image knext.local/coredns:$(notdir $(patsubst %/,%,$(dir $(COREDNS))))=$(COREDNS) \
		-image knext.local/netcheck:$(TAG)=$(IMAGES)/netcheck -out $(IMAGES)

# A local Kubernetes cluster of $(NODES) nodes on knext without CNI, nri-bridge as its network
# (RUNTIME=upstream: upstream containerd with CNI); it stays up until `make cluster-down`
# (docs/cluster.md).
cluster: build upstream images cluster-images
	@script/ci/check-deps.sh
	go build -o $(BIN)/knext-cluster ./cmd/knext-cluster
	$(BIN)/knext-cluster up -dir $(CLUSTER_DIR) -nodes $(NODES) -runtime $(RUNTIME)

cluster-down:
	go build -o $(BIN)/knext-cluster ./cmd/knext-cluster
	$(BIN)/knext-cluster down -dir $(CLUSTER_DIR)

# The release tarball and its checksum file in $(RELEASE_DIR) (docs/release.md).
release: build images
	@deploy/release/release.sh $(BIN) $(IMAGES) $(KNEXT_RELEASE)

# The README's run command: a real pod on a self-contained knext containerd under build/demo.
demo: build images
	@script/ci/check-deps.sh
	go build -o $(BIN)/knext-demo ./cmd/knext-demo
	$(BIN)/knext-demo -root $(BUILD)/demo

integration: build upstream images kubelet release cluster-images
	go test -race -count=1 -p 2 -timeout 30m ./integration/...

# The README's test command: every suite, counted per suite (script/ci/test.sh).
test: build upstream images kubelet release cluster-images
	@script/ci/check-deps.sh
	@script/build/verify.sh
	@script/build/verify-proto.sh
	@script/ci/lint.sh
	@script/ci/test.sh

BENCH := $(BUILD)/bench
# knext against upstream containerd on one node (docs/performance.md): PodSandboxStatus cost, pod
# lifecycle with CNI and CNI-less, and scale, paired and interleaved round by round, with 95%
# intervals and an A/A pair. Not part of `make test`. Tune it with BENCH_FLAGS, e.g.
# BENCH_FLAGS="-repeats 8 -benchmarks lifecycle". `make bench-cluster` measures a cluster of each
# runtime the same way, in its own run and report: it takes longer than the rest together.
BENCH_OUT ?= report.json
bench: build upstream images cluster-images
	@script/ci/check-deps.sh
	go build -o $(BENCH)/knext-bench ./cmd/knext-bench
	go build -o $(BENCH)/statusplugin ./internal/bench/statusplugin
	$(BENCH)/knext-bench -knext $(BIN)/containerd -upstream $(UPSTREAM_BIN)/containerd \
		-plugin $(BENCH)/statusplugin -nri-bridge $(BIN)/nri-bridge -out $(BENCH)/$(BENCH_OUT) $(BENCH_FLAGS)

bench-cluster:
	@$(MAKE) --no-print-directory bench BENCH_OUT=cluster.json BENCH_FLAGS="-benchmarks cluster $(BENCH_FLAGS)"

# docs/performance.md's tables, verdicts, short answer and plots, and its committed reports, from
# the reports of `make bench` and `make bench-cluster` (BENCH_REPORT, comma-separated; by default
# the last run's of each).
BENCH_REPORT ?= $(BENCH)/report.json,$(BENCH)/cluster.json
bench-doc:
	go run ./cmd/knext-bench doc -report $(BENCH_REPORT)

# The CRI validation suite (critest) against upstream containerd with CNI, knext with CNI and knext
# CNI-less with nri-bridge, in one run, compared (docs/conformance.md); not part of `make test`.
# critest comes from cri-tools at the version crictl is pinned to; the images it pulls are rebuilt
# and served locally. Tune it with CONFORMANCE_FLAGS, e.g. "-parallel" or "-only knext-cniless".
CRI_TOOLS_VERSION := $(shell cat script/ci/cri-tools.version)
CONFORMANCE := $(BUILD)/conformance
CRITEST := $(CONFORMANCE)/critest-$(CRI_TOOLS_VERSION)
BUSYBOX_DYNAMIC := /usr/local/lib/knext/busybox
conformance: build upstream images $(CRITEST)
	@script/ci/check-deps.sh
	CGO_ENABLED=0 go build -trimpath -ldflags=-s -o $(CONFORMANCE)/fakenginx ./internal/conformance/fakenginx
	CGO_ENABLED=0 go build -trimpath -ldflags=-s -o $(CONFORMANCE)/nnp ./internal/conformance/nnp
	go build -o $(CONFORMANCE)/knext-conformance ./cmd/knext-conformance
	$(CONFORMANCE)/knext-conformance images -busybox $(BUSYBOX_DYNAMIC) -pause $(IMAGES)/pause \
		-fakenginx $(CONFORMANCE)/fakenginx -nnp $(CONFORMANCE)/nnp -out $(CONFORMANCE)/critest-images.tar
	$(CONFORMANCE)/knext-conformance run -critest $(CRITEST) -images $(CONFORMANCE)/critest-images.tar \
		-out $(CONFORMANCE)/results $(CONFORMANCE_FLAGS)

# critest is a test binary (go test -c), built in cri-tools' own module from the module cache.
$(CRITEST):
	@dir=$$(GOWORK=off go mod download -json sigs.k8s.io/cri-tools@$(CRI_TOOLS_VERSION) | sed -n 's/^\t"Dir": "\(.*\)",$$/\1/p'); \
	[ -n "$$dir" ] || { echo "cannot download sigs.k8s.io/cri-tools@$(CRI_TOOLS_VERSION) from the Go module proxy" >&2; exit 1; }; \
	echo "building critest $(CRI_TOOLS_VERSION) from $$dir"; \
	GOWORK=off go test -C $$dir -c -o $@ -ldflags "-X sigs.k8s.io/cri-tools/pkg/version.Version=$(CRI_TOOLS_VERSION:v%=%)" ./cmd/critest

# Kubernetes' own end-to-end suite (e2e.test at the version third_party/kubernetes pins) on a cluster of
# $(NODES) knext nodes (CNI-less, nri-bridge) and then on one of upstream containerd with CNI,
# compared spec by spec into docs/conformance.md; not part of `make test`. e2e.test and agnhost are
# built like the kubelet, once per version; the images the specs run are rebuilt locally on a
# Debian root file system (mmdebstrap, once). K8S_CONFORMANCE_FOCUS selects the specs (default:
# sig-network's Conformance specs); K8S_CONFORMANCE_FLAGS adds flags, e.g. "-reruns 1".
# k8s-conformance-subset runs CI's fixed subset, K8S_CONFORMANCE_SUBSET, and writes no doc.
K8S_CONFORMANCE := $(BUILD)/k8s-conformance
K8S_CONFORMANCE_FOCUS ?= \[sig-network\].*\[Conformance\]
K8S_CONFORMANCE_SUBSET := \[sig-network\] (Networking Granular Checks: Pods should function for intra-pod communication: http|Services should serve a basic endpoint from pods|Services should be able to create a functioning NodePort service|DNS should provide DNS for services|HostPort validates that there is no conflict|Proxy version v1 should proxy through a service and a pod) .*\[Conformance\]
K8S_CONFORMANCE_DOC := docs/conformance.md
k8s-conformance-subset: K8S_CONFORMANCE_FOCUS = $(K8S_CONFORMANCE_SUBSET)
k8s-conformance-subset: K8S_CONFORMANCE_DOC =
E2E_ROOTFS := $(K8S_CONFORMANCE)/rootfs-bookworm.tar
k8s-conformance k8s-conformance-subset: build upstream images cluster-images $(E2E_ROOTFS)
	@script/ci/check-deps.sh
	@third_party/kubernetes/build.sh $(BUILD)/kubernetes e2e.test agnhost >/dev/null
	go build -o $(K8S_CONFORMANCE)/knext-k8s-conformance ./cmd/knext-k8s-conformance
	@dir=$$(GOWORK=off go mod download -json k8s.io/kubernetes@$(notdir $(patsubst %/,%,$(KNEXT_KUBERNETES_DIR))) | sed -n 's/^\t"Dir": "\(.*\)",$$/\1/p'); \
	[ -n "$$dir" ] || { echo "cannot download k8s.io/kubernetes from the Go module proxy" >&2; exit 1; }; \
	$(K8S_CONFORMANCE)/knext-k8s-conformance images -e2e-test $(KNEXT_KUBERNETES_DIR)e2e.test -rootfs $(E2E_ROOTFS) \
		-agnhost $(KNEXT_KUBERNETES_DIR)agnhost -agnhost-source $$dir/test/images/agnhost -coredns $(COREDNS) \
		-pause $(IMAGES)/pause -busybox /bin/busybox -out $(K8S_CONFORMANCE)/e2e-images.tar
	$(K8S_CONFORMANCE)/knext-k8s-conformance run -e2e-test $(KNEXT_KUBERNETES_DIR)e2e.test \
		-images $(K8S_CONFORMANCE)/e2e-images.tar -nodes $(NODES) -focus '$(K8S_CONFORMANCE_FOCUS)' \
		-out $(K8S_CONFORMANCE)/results/$@ -doc '$(K8S_CONFORMANCE_DOC)' $(K8S_CONFORMANCE_FLAGS)

$(E2E_ROOTFS): internal/k8sconformance/rootfs.sh
	@script/ci/check-deps.sh
	internal/k8sconformance/rootfs.sh $@

patches:
	@script/build/export.sh $(BUILD) patches

verify:
	@script/build/verify.sh

# The pinned and newest upstream versions, and whether the series applies to the newest (never fails).
upstream-check:
	@script/build/upstream-check.sh

# Regenerating upstream's own proto reproduces its generated files; materializing is deterministic.
verify-proto:
	@script/build/verify-proto.sh

# Every step of every series builds and passes the tests of the packages its patch touches
# (incremental: a step that passed at the same commit is not run again).
verify-series:
	@script/build/verify-series.sh

# The series as they would be pushed upstream (generated code committed): build/upstream-branches.
upstream-branches:
	@script/build/upstream-branches.sh

# Upstream's own CI checks on those branches, counted (not part of `make test`: see docs/developing.md).
upstream-ci: upstream-branches
	@script/build/upstream-ci.sh

clean:
	rm -rf $(BUILD)
