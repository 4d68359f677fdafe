# SPDX-License-Identifier: BSD-2-Clause (see LICENSE)
# ngx_http_singleflight_module
#
#   make demo        build, start nginx + module + a slow origin, fire a herd
#   make test        build and run the test suite (t/, with prove)
#   make test-pid-reuse  the case of a worker respawned with its dead
#                    predecessor's pid, alone (it sets the machine's next pid)
#   make test-asan   the same suite with the module under ASan and UBSan
#   make test-asan-full  the same with nginx itself built with them too
#   make soak        a randomized fault soak (2.5 min) under ASan and UBSan
#   make fuzz        randomized differential runs, module on vs off (2 min)
#   make fuzz-asan   the same with the module under ASan and UBSan
#                    (FUZZ_BLOCKS=resume: origins that break off, Ranges)
#   make bench       benchmarks (bench/), results in bench/results/
#   make fleet-demo  one herd through one edge, two, and 2 edges + 3 shields
#   make deb         build/deb/libnginx-mod-http-singleflight_<version>_<arch>.deb
#   make test-deb    build the package, check it, nginx -t with its snippet
#   make test-nonuma the module built without NUMA interfaces (FreeBSD-like)
#   make build-nodebug the module built without --with-debug (-Werror)
#   make nginx-tests NGINX_TESTS=/path  nginx's own tests, plain and with
#                    the module; fails on a difference not intended
#
# Every target installs the Debian packages it needs (tools/deps.sh).
#
# By default the module is built for Debian's own nginx (/usr/sbin/nginx,
# package nginx-dev).  With NGINX_SRC=/path/to/nginx-x.y.z (a release, git
# or Debian source tree) the targets build that nginx and the module
# against it into build/nginx-x.y.z/ (tools/build-nginx.sh) and run against
# that binary instead:
#
#   make test NGINX_SRC=/path/to/nginx-1.31.4
#   make test-asan NGINX_SRC=$(tools/fetch-nginx-debian.sh | tail -1)

SHELL := /bin/bash
SOURCES := config ngx_http_singleflight_module.c $(wildcard src/*.c src/*.h)

ifeq ($(NGINX_SRC),)
MODULE := build/ngx_http_singleflight_module.so
ASAN_MODULE := build/asan/ngx_http_singleflight_module.so
NGINX_BIN :=
BUILD_PLAIN := tools/build-module.sh plain
BUILD_ASAN := tools/build-module.sh asan
BUILD_DEPS := build
TEST_DEPS := test
else
NGINX_VERSION := $(shell sed -n 's/^\#define NGINX_VERSION *"\(.*\)"/\1/p' \
    $(NGINX_SRC)/src/core/nginx.h 2>/dev/null)
ifeq ($(NGINX_VERSION),)
$(error NGINX_SRC=$(NGINX_SRC): no nginx source tree there)
endif
ANGIE_VERSION := $(shell sed -n 's/^\#define ANGIE_VERSION *"\(.*\)"/\1/p' \
    $(NGINX_SRC)/src/core/angie.h 2>/dev/null)
ifeq ($(ANGIE_VERSION),)
NGINX_OUT := build/nginx-$(NGINX_VERSION)
else
NGINX_OUT := build/angie-$(ANGIE_VERSION)
endif
MODULE := $(NGINX_OUT)/ngx_http_singleflight_module.so
ASAN_MODULE := $(NGINX_OUT)/asan/ngx_http_singleflight_module.so
NGINX_BIN := $(NGINX_OUT)/sbin/nginx
BUILD_PLAIN := tools/build-nginx.sh $(NGINX_SRC) plain >/dev/null
BUILD_ASAN := tools/build-nginx.sh $(NGINX_SRC) asan >/dev/null
BUILD_DEPS := nginx-src
TEST_DEPS := test-src
# the harness (t/lib/SFTest.pm) and bench/ run this binary
export SF_NGINX := $(CURDIR)/$(NGINX_BIN)
endif
PROVE_JOBS ?= 2
# the test files (or directories) make test and make test-asan run
TEST_FILES ?= t/

# the sanitizer runtimes go first in the process, before nginx's libraries
ASAN_RT = $(shell gcc -print-file-name=libasan.so.8)
UBSAN_RT = $(shell gcc -print-file-name=libubsan.so.1)
# what both sanitized runs share; each test's reports go to files in its
# own directory, which the harness reads at the end of the test
ASAN_OPTS = detect_leaks=0:abort_on_error=0:log_path=%%TESTDIR%%/asan
UBSAN_ENV = UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=0:log_path=%%TESTDIR%%/ubsan
ASAN_ENV = LD_PRELOAD=$(ASAN_RT):$(UBSAN_RT) ASAN_OPTIONS=$(ASAN_OPTS) $(UBSAN_ENV)

.PHONY: all build build-asan build-nodebug deps test test-pid-reuse test-asan test-asan-full test-deb test-nonuma nginx-tests deb soak fuzz fuzz-asan demo fleet-demo bench clean

all: build

build: $(MODULE)

$(MODULE): $(SOURCES) $(NGINX_BIN)
	@tools/deps.sh $(BUILD_DEPS)
	@$(BUILD_PLAIN)

ifneq ($(NGINX_BIN),)
# only when missing: the module's rule rebuilds it with the module
$(NGINX_BIN):
	@tools/deps.sh $(BUILD_DEPS)
	@$(BUILD_PLAIN)
endif

build-asan: $(ASAN_MODULE)

$(ASAN_MODULE): $(SOURCES) $(NGINX_BIN)
	@tools/deps.sh asan
	@tools/deps.sh $(BUILD_DEPS)
	@$(BUILD_ASAN)

test: $(MODULE)
	@tools/deps.sh $(TEST_DEPS)
	SF_MODULE=$(CURDIR)/$(MODULE) prove -j$(PROVE_JOBS) -I t/lib $(TEST_FILES)

# the one case that sets the kernel's next pid for the whole machine (a
# respawned worker given its dead predecessor's pid): alone, never beside
# other tests, whose processes would get pids freed moments ago
test-pid-reuse: $(MODULE)
	@tools/deps.sh $(TEST_DEPS)
	SF_TEST_PID_REUSE=1 SF_MODULE=$(CURDIR)/$(MODULE) \
	    prove -I t/lib t/singleflight_dead_leader.t

test-asan: $(ASAN_MODULE)
	@tools/deps.sh asan
	@tools/deps.sh $(TEST_DEPS)
	SF_MODULE=$(CURDIR)/$(ASAN_MODULE) SF_NGINX_ENV="$(ASAN_ENV)" \
	    prove -j$(PROVE_JOBS) -I t/lib $(TEST_FILES)

# nginx itself built with ASan and UBSan too, and the module in the same
# tree (tools/build-nginx.sh asan-full): a use after free in nginx's own
# code, on memory the module let go too early, shows only there.  Needs an
# nginx source tree: NGINX_SRC, or by default Debian 13's source package
# (tools/fetch-nginx-debian.sh).  Every dynamic module defines nginx's
# module tables again, hence detect_odr_violation=0.
ASAN_FULL_ENV = \
    ASAN_OPTIONS=$(ASAN_OPTS):detect_odr_violation=0 $(UBSAN_ENV)

test-asan-full:
ifeq ($(NGINX_SRC),)
	@tools/deps.sh fetch
	@src=$$(tools/fetch-nginx-debian.sh | tail -1) \
	    && $(MAKE) --no-print-directory test-asan-full NGINX_SRC="$$src"
else
	@tools/deps.sh asan
	@tools/deps.sh nginx-src
	@tools/deps.sh test-src
	@tools/build-nginx.sh $(NGINX_SRC) asan-full >/dev/null
	SF_NGINX=$(CURDIR)/$(NGINX_OUT)/asan-full/sbin/nginx \
	SF_MODULE=$(CURDIR)/$(NGINX_OUT)/asan-full/ngx_http_singleflight_module.so \
	SF_NGINX_ENV="$(ASAN_FULL_ENV)" \
	    prove -j$(PROVE_JOBS) -I t/lib $(TEST_FILES)
endif

# the Debian package, built against Debian's nginx-dev (debian/, dh_nginx)
deb:
	@tools/deps.sh deb
	@tools/build-deb.sh

# builds the package, checks its contents and dependencies, and that nginx
# -t loads the module from the extracted package
test-deb:
	@tools/deps.sh deb
	@tools/deps.sh test
	prove -v -I t/lib t/package/

# the module built as without the NUMA interfaces (FreeBSD-like): it
# builds, and nginx -t says scope=numa has one instance as scope=process
NONUMA_MODULE := build/nonuma/ngx_http_singleflight_module.so

$(NONUMA_MODULE): $(SOURCES)
	@tools/deps.sh build
	@tools/build-module.sh nonuma

test-nonuma: $(NONUMA_MODULE)
	@tools/deps.sh test
	SF_MODULE=$(CURDIR)/$(NONUMA_MODULE) prove -v -I t/lib t/build/

# nginx configured without --with-debug, as nginx.org's binaries are: code
# used only by the debug log must not warn (nginx builds with -Werror)
build-nodebug:
ifeq ($(NGINX_SRC),)
	@tools/deps.sh build
	@tools/build-module.sh nodebug
else
	@tools/deps.sh nginx-src
	@tools/build-nginx.sh $(NGINX_SRC) nodebug >/dev/null
endif

SOAK_SECONDS ?= 150

soak: $(ASAN_MODULE)
	@tools/deps.sh asan
	@tools/deps.sh $(TEST_DEPS)
	SOAK_SECONDS=$(SOAK_SECONDS) SF_MODULE=$(CURDIR)/$(ASAN_MODULE) \
	    SF_NGINX_ENV="$(ASAN_ENV)" prove -v -I t/lib t/soak/soak.t

# nginx's own test suite (a working tree of nginx-tests, not part of this
# repo), plain and with the module on (tools/nginx-tests.sh)
ifeq ($(NGINX_SRC),)
NGINX_TESTS_BINARY := /usr/sbin/nginx
NGINX_TESTS_MODULES := /usr/lib/nginx/modules
else
NGINX_TESTS_BINARY := $(NGINX_BIN)
NGINX_TESTS_MODULES := $(NGINX_OUT)/modules
endif

nginx-tests: $(MODULE)
	@test -n "$(NGINX_TESTS)" || { echo "NGINX_TESTS=/path/to/nginx-tests is needed" >&2; exit 2; }
	@tools/deps.sh nginx-tests
	tools/nginx-tests.sh $(NGINX_TESTS) $(NGINX_TESTS_BINARY) $(MODULE) $(NGINX_TESTS_MODULES)

FUZZ_SECONDS ?= 120

# not part of `make test`: stops at the first difference and prints it;
# FUZZ_SEED=N (and FUZZ_ROUND=K) replays a run (a round)
fuzz: $(MODULE)
	@tools/deps.sh $(TEST_DEPS)
	SF_MODULE=$(CURDIR)/$(MODULE) FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_SEED=$(FUZZ_SEED) FUZZ_ROUND=$(FUZZ_ROUND) \
	    FUZZ_BLOCKS="$(FUZZ_BLOCKS)" \
	    prove -v -I t/lib t/fuzz/differential.t

# the same rounds with the module built with ASan and UBSan, as make soak
# runs it: a report fails the round it came in.  .ci/run runs 150 s of the
# resume block so (FUZZ_BLOCKS=resume: origins that break off, change the
# response or answer a Range wrongly, and clients' ranges)
fuzz-asan: $(ASAN_MODULE)
	@tools/deps.sh asan
	@tools/deps.sh $(TEST_DEPS)
	SF_MODULE=$(CURDIR)/$(ASAN_MODULE) SF_NGINX_ENV="$(ASAN_ENV)" \
	    FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_SEED=$(FUZZ_SEED) FUZZ_ROUND=$(FUZZ_ROUND) \
	    FUZZ_BLOCKS="$(FUZZ_BLOCKS)" \
	    prove -v -I t/lib t/fuzz/differential.t

demo: $(MODULE)
	@tools/deps.sh demo
	@SF_MODULE=$(CURDIR)/$(MODULE) perl -I t/lib bench/demo.pl

fleet-demo: $(MODULE)
	@tools/deps.sh demo
	@SF_MODULE=$(CURDIR)/$(MODULE) perl -I t/lib bench/fleet.pl --demo

bench: $(MODULE)
	@tools/deps.sh bench
	@SF_MODULE=$(CURDIR)/$(MODULE) perl -I t/lib bench/bench.pl
	@SF_MODULE=$(CURDIR)/$(MODULE) perl -I t/lib bench/lone.pl --cache-sim --perf --browser --cookie --conditional
	@SF_MODULE=$(CURDIR)/$(MODULE) perl -I t/lib bench/lone.pl --lone direct --scopes process,numa,worker,pinned
	@bench/floor.sh
	@SF_MODULE=$(CURDIR)/$(MODULE) perl -I t/lib bench/resume.pl
	@SF_MODULE=$(CURDIR)/$(MODULE) perl -I t/lib bench/hedge.pl
	@SF_MODULE=$(CURDIR)/$(MODULE) perl -I t/lib bench/stream.pl
	@SF_MODULE=$(CURDIR)/$(MODULE) perl -I t/lib bench/cachehit.pl
	@SF_MODULE=$(CURDIR)/$(MODULE) perl -I t/lib bench/fleet.pl

clean:
	rm -rf build
