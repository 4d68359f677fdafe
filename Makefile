# ngx_http_singleflight_module
#
#   make demo        build, start nginx + module + a slow origin, fire a herd
#   make test        build and run the test suite (t/, with prove)
#   make test-asan   the same suite with the module under ASan and UBSan
#   make soak        a randomized fault soak (2.5 min) under ASan and UBSan
#   make fuzz        randomized differential runs, module on vs off (2 min)
#   make bench       benchmarks (bench/), results in bench/results/
#
# Every target installs the Debian packages it needs (tools/deps.sh).

SHELL := /bin/bash
MODULE := build/ngx_http_singleflight_module.so
ASAN_MODULE := build/asan/ngx_http_singleflight_module.so
SOURCES := config ngx_http_singleflight_module.c $(wildcard src/*.c src/*.h)
PROVE_JOBS ?= 2

# the sanitizer runtimes go first in the process, before nginx's libraries
ASAN_RT = $(shell gcc -print-file-name=libasan.so.8)
UBSAN_RT = $(shell gcc -print-file-name=libubsan.so.1)
ASAN_ENV = LD_PRELOAD=$(ASAN_RT):$(UBSAN_RT) \
    ASAN_OPTIONS=detect_leaks=0:abort_on_error=0:log_path=%%TESTDIR%%/asan \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=0:log_path=%%TESTDIR%%/ubsan

.PHONY: all build build-asan deps test test-asan soak fuzz demo bench clean

all: build

build: $(MODULE)

$(MODULE): $(SOURCES)
	@tools/deps.sh build
	@tools/build-module.sh plain

build-asan: $(ASAN_MODULE)

$(ASAN_MODULE): $(SOURCES)
	@tools/deps.sh asan
	@tools/build-module.sh asan

test: $(MODULE)
	@tools/deps.sh test
	prove -j$(PROVE_JOBS) -I t/lib t/

test-asan: $(ASAN_MODULE)
	@tools/deps.sh asan
	SF_MODULE=$(CURDIR)/$(ASAN_MODULE) SF_NGINX_ENV="$(ASAN_ENV)" \
	    prove -j$(PROVE_JOBS) -I t/lib t/

SOAK_SECONDS ?= 150

soak: $(ASAN_MODULE)
	@tools/deps.sh asan
	SOAK_SECONDS=$(SOAK_SECONDS) SF_MODULE=$(CURDIR)/$(ASAN_MODULE) \
	    SF_NGINX_ENV="$(ASAN_ENV)" prove -v -I t/lib t/soak/soak.t

FUZZ_SECONDS ?= 120

# not part of `make test`: stops at the first difference and prints it;
# FUZZ_SEED=N (and FUZZ_ROUND=K) replays a run (a round)
fuzz: $(MODULE)
	@tools/deps.sh test
	FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_SEED=$(FUZZ_SEED) FUZZ_ROUND=$(FUZZ_ROUND) \
	    FUZZ_BLOCKS="$(FUZZ_BLOCKS)" \
	    prove -v -I t/lib t/fuzz/differential.t

demo: $(MODULE)
	@tools/deps.sh demo
	@perl -I t/lib bench/demo.pl

bench: $(MODULE)
	@tools/deps.sh bench
	@perl -I t/lib bench/bench.pl

clean:
	rm -rf build
