# kube-userspace-proxy. `make run` and `make test` are the two commands a
# newcomer needs; both set up what they use.

SHELL    := /bin/bash
GO       ?= go
BIN      := bin
PROXY    := $(BIN)/kube-userspace-proxy
FUZZTIME ?= 10s
export GOFLAGS ?= -buildvcs=false

.PHONY: all build run demo test check fmt vet vet-linux vet-other staticcheck unit integration test-sctp fuzz bench deps clean

all: build

# The version --version prints: git describe of this checkout, when git can
# tell (the go command's own stamping is off, see GOFLAGS above).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null)
# The commit, for --version, the start-up log and kubernetes_build_info.
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null)
# Its committer date, the build date kubernetes_build_info reports (the same
# for every build of a commit).
COMMIT_DATE ?= $(shell git log -1 --format=%cI 2>/dev/null)
BUILDINFO := github.com/kube-userspace-proxy/kube-userspace-proxy/internal/buildinfo

build:
	$(GO) build -ldflags "-X $(BUILDINFO).version=$(VERSION) -X $(BUILDINFO).commit=$(COMMIT) -X $(BUILDINFO).commitDate=$(COMMIT_DATE)" -o $(PROXY) ./cmd/kube-userspace-proxy
	$(GO) build -o $(BIN)/demo ./examples/demo

## run: the proxy in the foreground on examples/demo.yaml with its demo backends (no cluster, no root).
run: build
	./hack/run.sh

## demo: a scripted tour that sends TCP and UDP traffic through the proxy and exits.
demo: build
	./hack/demo.sh

## test: everything CI runs: build, check, integration tests, the SCTP tests
## in a VM, a short fuzz pass. Work that only compiles runs beside tests that
## mostly wait, at the lowest CPU priority (hack/beside.sh): the build of
## kube-apiserver and etcd beside the unit tests, the vets for other systems,
## staticcheck and the SCTP VM's binaries beside the integration tests.
test: deps
	./hack/beside.sh ./hack/kube-tools.sh -- $(MAKE) --no-print-directory build fmt vet-linux unit
	./hack/beside.sh '$(MAKE) --no-print-directory vet-other staticcheck && SCTP_BUILD_ONLY=1 ./hack/test-sctp.sh' -- $(MAKE) --no-print-directory integration
	$(MAKE) --no-print-directory test-sctp fuzz
	@echo "make test: all passed"

deps:
	./hack/deps.sh

## check: gofmt, go vet, staticcheck and the unit tests under the race detector.
check: fmt vet staticcheck unit

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet: vet-linux vet-other

vet-linux:
	$(GO) vet ./...
	$(GO) vet -tags integration ./integration/...
	$(GO) vet -tags goroutines ./userspace

# The other systems the proxy builds for.
vet-other:
	GOOS=darwin $(GO) vet ./...
	GOOS=freebsd $(GO) vet ./...
	GOOS=windows $(GO) vet ./...
	GOOS=solaris $(GO) vet ./...
	GOOS=aix GOARCH=ppc64 $(GO) vet ./...

staticcheck:
	$(GO) tool staticcheck ./...
	$(GO) tool staticcheck -tags integration ./integration/...
	$(GO) tool staticcheck -tags goroutines ./userspace

## unit: the unit tests under the race detector; the data plane also with
## its portable goroutine implementation (what macOS, the BSDs and Windows run; Windows has no UDP).
unit:
	$(GO) test -race -count=1 ./...
	$(GO) test -race -count=1 -tags goroutines ./userspace

## integration: end-to-end tests of the real binary with real clients, in
## network namespaces (root) and against a real kube-apiserver and etcd,
## which hack/kube-tools.sh builds once into ~/.cache (about 6 minutes cold).
integration: build
	./hack/kube-tools.sh
	KUP_PROXY_BIN=$(CURDIR)/$(PROXY) $(GO) test -tags integration -count=1 -timeout 30m -v ./integration/...

## test-sctp: the SCTP tests (internal/sctp, userspace, integration), which
## this kernel cannot run, in a qemu TCG VM booting Debian's cloud kernel;
## hack/test-sctp.sh installs qemu and caches the kernel in ~/.cache.
test-sctp:
	./hack/test-sctp.sh

## fuzz: a short pass of every fuzz target (hack/fuzz.sh).
fuzz:
	FUZZTIME=$(FUZZTIME) ./hack/fuzz.sh

## bench: the proxy against no proxy, HAProxy, nginx, socat and a Go io.Copy proxy
## (BENCHFLAGS=-short for a 30-second smoke run; see bench/README.md).
bench: build
	./bench/run.sh $(BENCHFLAGS)

clean:
	rm -rf $(BIN)
