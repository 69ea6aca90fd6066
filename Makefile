# proxyhealth: build and test. `make test` is what CI runs (.ci/run).
GO ?= go
# The exporter and the tests need root (netlink, network namespaces): when not root, the run and
# test targets go through sudo where it exists, keeping PATH so that the same go is used.
SUDO := $(if $(filter 0,$(shell id -u)),,$(if $(shell command -v sudo 2>/dev/null),sudo env PATH="$$PATH" HOME="$$HOME",))
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo unknown)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X github.com/prometheus/common/version.Version=$(VERSION) -X github.com/prometheus/common/version.Revision=$(REVISION)
# Static (no cgo: the exporter raises its file capabilities in every thread, which a cgo binary
# cannot), no build paths. The image's binary is the same, stripped (-s -w).
BUILDFLAGS := -trimpath -ldflags '$(LDFLAGS)'
IMAGE_BUILDFLAGS := -trimpath -ldflags '-s -w $(LDFLAGS)'
# Every go command below but the race detector's builds the way the image does (static,
# -trimpath): a fresh machine then compiles the dependency graph once for vet, the alert and
# dashboard checks, the labs, the kernel matrix, the benchmarks and the image, not once for each
# build configuration (each a few CPU-minutes on a 2-core machine).
export CGO_ENABLED := 0
export GOFLAGS := -trimpath $(filter-out -trimpath,$(GOFLAGS))

# The image: podman when present (no daemon, no registry: what CI uses), else docker (BuildKit).
CONTAINER_ENGINE ?= $(shell command -v podman 2>/dev/null || command -v docker 2>/dev/null || echo podman)
IMAGE ?= proxyhealth:$(VERSION)
# The directory make image hands to the Dockerfile in place of its build stage.
IMAGE_CONTEXT ?= .build/image
# The platforms the exporter must build for (make cross).
CROSS_PLATFORMS ?= linux/amd64 linux/arm64
ifeq ($(notdir $(firstword $(CONTAINER_ENGINE))),podman)
# The build's RUN step with the caller's own file limits: podman's default (1048576) is above
# the hard limit of some sandboxes, CI's among them, and runc then cannot start the step. No
# intermediate images left behind. TARGETOS for the replaced build stage's ARG line (podman
# warns it is unset; TARGETARCH it sets).
IMAGE_ENGINE_FLAGS ?= --layers=false --ulimit nofile=$$(ulimit -Hn):$$(ulimit -Hn) --build-arg TARGETOS=linux
endif

.PHONY: all build plugin run image image-binaries cross test test-all vet unit kube etcd alerts dashboards deploy-check deploy-generate e2e kernels ipvs-lab bench-smoke labs cross-check prebuild-start prebuild-wait

all: build

build:
	CGO_ENABLED=0 $(GO) build $(BUILDFLAGS) -o proxyhealth .

# The kubectl plugin, for this machine (GOOS/GOARCH for another): put kubectl-proxyhealth on PATH
# and run `kubectl proxyhealth`.
plugin:
	CGO_ENABLED=0 $(GO) build $(BUILDFLAGS) -o kubectl-proxyhealth ./cmd/kubectl-proxyhealth

# What the image holds, in $(OUT): proxyhealth for GOOS/GOARCH (default this machine's) and
# setfcap, which sets its file capabilities during the image build, for this machine. The
# Dockerfile's build stage runs this target.
OUT ?= $(IMAGE_CONTEXT)/out
image-binaries:
	CGO_ENABLED=0 GOOS=$(GOOS) GOARCH=$(GOARCH) $(GO) build $(IMAGE_BUILDFLAGS) -o $(OUT)/proxyhealth .
	CGO_ENABLED=0 GOOS= GOARCH= $(GO) build -trimpath -ldflags '-s -w' -o $(OUT)/setfcap ./cmd/setfcap

# The image (Dockerfile), from the binaries built here: nothing is pulled. The Dockerfile's
# build stage is replaced by $(IMAGE_CONTEXT) (--build-context, podman 4.3 or docker buildx).
image:
	$(MAKE) image-binaries OUT=$(IMAGE_CONTEXT)/out GOOS= GOARCH=
	$(CONTAINER_ENGINE) build $(IMAGE_ENGINE_FLAGS) --build-context build=$(IMAGE_CONTEXT) \
		--build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) -t $(IMAGE) -f Dockerfile $(IMAGE_CONTEXT)
	@$(CONTAINER_ENGINE) image inspect --format '$(IMAGE): {{.Size}} bytes' $(IMAGE)

# The exporter and setfcap build for every platform of CROSS_PLATFORMS (CI: linux/arm64 too), the
# kubectl plugin for the engineers' machines of PLUGIN_PLATFORMS (linux/amd64: the e2e lab runs it).
PLUGIN_PLATFORMS ?= darwin/arm64 windows/amd64
cross:
	@set -e; for p in $(CROSS_PLATFORMS); do \
		echo "GOOS=$${p%/*} GOARCH=$${p#*/}"; \
		CGO_ENABLED=0 GOOS=$${p%/*} GOARCH=$${p#*/} $(GO) build $(IMAGE_BUILDFLAGS) -o /dev/null . ./cmd/setfcap; \
	done
	@set -e; for p in $(PLUGIN_PLATFORMS); do \
		echo "kubectl-proxyhealth GOOS=$${p%/*} GOARCH=$${p#*/}"; \
		CGO_ENABLED=0 GOOS=$${p%/*} GOARCH=$${p#*/} $(GO) build $(IMAGE_BUILDFLAGS) -o /dev/null ./cmd/kubectl-proxyhealth; \
	done

# What make test runs in place of cross: the same packages and platforms type-checked from
# source (test/crosscheck, a module of its own), every import included, which is what a
# platform's build tags and system interfaces can break in code that, like this, is pure Go;
# a fraction of a minute, where compiling the dependency graph again for each platform takes
# minutes on a 2-core machine. The host's own platform is built by the labs (make image).
comma := ,
space := $(subst ,, )
cross-check:
	cd test/crosscheck && $(GO) vet . && $(GO) test -count=1 .
	cd test/crosscheck && $(GO) run . -C ../.. -platforms '$(subst $(space),$(comma),$(CROSS_PLATFORMS))' . ./cmd/setfcap
	cd test/crosscheck && $(GO) run . -C ../.. -platforms '$(subst $(space),$(comma),$(PLUGIN_PLATFORMS))' ./cmd/kubectl-proxyhealth

# deploy/ and charts/: the PrometheusRule is generated from alerts/proxyhealth.rules.yml, and the
# chart's files/ from alerts/ and dashboards/, by test/deploy (a separate module: kustomize,
# Helm and the Prometheus Operator's types stay out of go.mod).
deploy-generate:
	cd test/deploy && $(GO) run . prometheusrule ../../alerts/proxyhealth.rules.yml ../../deploy/prometheus-operator/prometheusrule.yaml
	cd test/deploy && $(GO) run . chart-files ../..

# The deploy tool's tests: the generated files are current, the chart lints (--strict) and
# renders with each values file of charts/proxyhealth/ci, and renders what the kustomize overlay
# does. The manifests against a real apiserver, and a real helm install, upgrade and uninstall:
# TestDeployManifests in the e2e lab (make e2e), which starts that apiserver.
deploy-check:
	cd test/deploy && $(GO) vet ./... && $(GO) test -count=1 ./...

vet:
	test/tracked-size.sh
	@unformatted="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))"; \
	if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) mod tidy -diff
	$(GO) vet ./...
	$(GO) vet -tags e2e ./test/e2e/...

# Unit tests; packages that need the kernel re-run themselves in a private network namespace
# when run as root, and skip those tests otherwise.
unit:
	CGO_ENABLED=1 $(GO) test -race -count=1 ./...

# The Kubernetes version the control-plane lab runs (kube-apiserver and kube-proxy): the default
# is test/kube/VERSION, what CI runs; any version with a module in test/kube/ (v1.34.4, v1.35.4,
# v1.36.3, v1.37.2) with e.g. `make kube e2e KUBE_VERSION=v1.34.4`.
KUBE_VERSION ?= $(shell cat test/kube/VERSION)

# kube-apiserver and kube-proxy for the control-plane lab, built from test/kube/$(KUBE_VERSION) (a
# separate module) into a cache keyed by version; a no-op once built (the first build takes minutes).
kube:
	test/kube/build.sh $(KUBE_VERSION)

# The etcd the control-plane lab and the benchmarks run, at the version test/etcd/go.mod pins (a
# separate module), built into ~/.cache/proxyhealth/etcd/<version>; a no-op once built.
etcd:
	test/etcd/build.sh

# The alert rules: promtool check rules, the promtool unit tests (alerts/tests/), and
# promtool check metrics on a live scrape of the exporter (in a network namespace, as root).
alerts:
	alerts/test.sh

# The Grafana dashboards: the committed JSON is what dashboards/gen writes and follows the
# dashboards' conventions; grafana's dashboard-linter (built from the separate module
# dashboards/lint into ~/.cache/proxyhealth/tools, a no-op once built) passes with --strict.
dashboards:
	$(GO) test -count=1 ./dashboards/...
	dashboards/lint/lint.sh

# The kernel lab: incidents 1 and 2 reproduced in network namespaces, asserted on real scrapes;
# the control-plane lab (etcd, kube-apiserver, kube-proxy) reproduces incident 3.
e2e:
	PROXYHEALTH_KUBE_VERSION=$(KUBE_VERSION) $(GO) test -tags e2e -count=1 -timeout 30m -v ./test/e2e/

# The kernel matrix: the kernel tests (test/vm/tests) and the kernel lab's incidents 1 and 2 and
# INVALID reasons, run as root on each kernel of test/vm/kernels (Linux 6.1 and 6.12) booted in
# QEMU from Debian's packages, as the host's kernel runs them in unit and e2e. The guests' images
# are built into ~/.cache/proxyhealth/vm, a few minutes the first time (test/vm/README.md).
# One kernel, some tests: make kernels KERNELS=6.1 RUN=TestLabInvalidPackets
KERNELS ?=
RUN ?=
kernels:
	KERNELS='$(KERNELS)' RUN='$(RUN)' test/vm/matrix.sh

# The IPVS lab: the control-plane lab's IPVS tests with the real kube-proxy in --proxy-mode=ipvs
# (by default test/kube/VERSION's, what CI runs), in a Linux 6.1 guest with the whole lab inside,
# one guest per version side by side: this machine's kernel has no IPVS (test/vm/README.md).
# The oldest and the newest: make ipvs-lab KUBE_PROXY_VERSIONS='v1.34.4 v1.37.2'
# One test: make ipvs-lab RUN=TestDriftCutOffIPVS
KUBE_PROXY_VERSIONS ?=
ipvs-lab:
	KUBE_PROXY_VERSIONS='$(KUBE_PROXY_VERSIONS)' RUN='$(RUN)' test/vm/ipvs-lab.sh

# The conntrack event and rules drift benchmarks at smoke size, and the node-cost benchmark's
# smoke for the iptables-legacy mode (about a minute): prove the harnesses, assert no figures.
# Each waits for a benchmark someone else runs on the machine (they share a lock) rather than fail.
bench-smoke:
	$(GO) run ./bench/conntrack-events --smoke --lock-wait 30m
	$(GO) run ./bench/rules-drift --smoke --lock-wait 30m
	$(GO) run ./bench/node-cost --mode iptables-legacy --smoke --lock-wait 30m

# Run the exporter on this host: http://localhost:9869/
run: build
	$(SUDO) ./proxyhealth

# Every test, as CI runs them: the Debian packages first (test/deps.sh), then the rest, as root.
test:
	$(SUDO) test/deps.sh
	$(SUDO) $(MAKE) test-all

# The one-time builds of the later stages (the VM guests, etcd, kube-apiserver and kube-proxy,
# test/prebuild.sh) run in the background, side by side, at the lowest priority, from the start:
# on a fresh machine they overlap the stages that need none of them (vet, the unit tests, the
# cross builds, the alert rules, the dashboards and the manifests) instead of following them. The
# kernel matrix needs only the guests, so it waits only for them.
prebuild-start:
	test/prebuild.sh start

prebuild-wait:
	test/prebuild.sh wait

# The labs (test/labs.sh): the guests' labs, CPU-bound under TCG, beside e2e, which mostly waits.
labs:
	MAKE='$(MAKE)' test/labs.sh

test-all: prebuild-start vet unit cross-check alerts dashboards deploy-check labs bench-smoke
