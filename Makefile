# proxyhealth: build and test. `sudo make test` is what CI runs (.ci/run).
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo unknown)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X github.com/prometheus/common/version.Version=$(VERSION) -X github.com/prometheus/common/version.Revision=$(REVISION)
# The Dockerfile runs `make build`: the binary CI tests is the one the image ships.
BUILDFLAGS := -trimpath -ldflags '$(LDFLAGS)'

.PHONY: all build image test vet unit kube alerts dashboards deploy-check deploy-generate e2e bench-smoke

all: build

build:
	CGO_ENABLED=0 $(GO) build $(BUILDFLAGS) -o proxyhealth .

# The image (Dockerfile); needs a Docker engine.
image:
	docker build --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) -t proxyhealth:$(VERSION) .

# deploy/: the PrometheusRule is generated from alerts/proxyhealth.rules.yml by test/deploy (a
# separate module: kustomize and the Prometheus Operator's types stay out of go.mod).
deploy-generate:
	cd test/deploy && $(GO) run . prometheusrule ../../alerts/proxyhealth.rules.yml ../../deploy/prometheus-operator/prometheusrule.yaml

# The deploy tool's tests, including that the generated PrometheusRule is current. The
# manifests against a real apiserver: TestDeployManifests in the e2e lab.
deploy-check:
	cd test/deploy && $(GO) vet ./... && $(GO) test -count=1 ./...

vet:
	@unformatted="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))"; \
	if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	$(GO) mod tidy -diff
	$(GO) vet ./...
	$(GO) vet -tags e2e ./test/e2e/...

# Unit tests; packages that need the kernel re-run themselves in a private network namespace
# when run as root, and skip those tests otherwise.
unit:
	$(GO) test -race -count=1 ./...

# kube-apiserver and kube-proxy for the control-plane lab, built from test/kube (a separate
# module) into a cache keyed by version; a no-op once built (the first build takes minutes).
kube:
	test/kube/build.sh

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
	$(GO) test -tags e2e -count=1 -v ./test/e2e/

# The conntrack event and rules drift benchmarks at smoke size, and the node-cost benchmark's
# smoke for the iptables-legacy mode (about a minute): prove the harnesses, assert no figures.
bench-smoke:
	$(GO) run ./bench/conntrack-events --smoke
	$(GO) run ./bench/rules-drift --smoke
	$(GO) run ./bench/rules-drift node-cost --mode iptables-legacy --smoke

test: vet unit kube alerts dashboards deploy-check e2e bench-smoke
