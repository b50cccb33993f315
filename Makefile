# The two front-door commands. Everything else is CMake (build/) and ctest.
#   make run   build the library and the moe tool only, then run the main job: the embedded
#              Qwen3-30B-A3B layer benchmark (the table on stdout; progress on a terminal only)
#   make test  build everything (the tests too), then run the whole test suite
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?= -DMOE_WERROR=ON -DPython3_EXECUTABLE=$(shell command -v python3)
# no "Entering/Leaving directory" lines from the sub-makes of cmake --build
MAKEFLAGS += --no-print-directory

.PHONY: all deps configure build build-tool run test test-fast test-python test-asan test-tsan test-nompi fuzz-build fuzz fuzz-smoke clean

all: build

deps:
	@./scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null

build: configure
	cmake --build $(BUILD) -j$(JOBS)

# libmoe and build/moe, nothing else; the compiler's lines go to $(BUILD)/build-tool.log and
# are shown only when the build fails
build-tool: configure
	@echo "building libmoe and the moe tool (log: $(BUILD)/build-tool.log)"
	@cmake --build $(BUILD) -j$(JOBS) --target moe >$(BUILD)/build-tool.log 2>&1 || \
		{ tail -n 60 $(BUILD)/build-tool.log >&2; echo "make: the build failed; the whole log is $(BUILD)/build-tool.log" >&2; exit 1; }

run: build-tool
	@./$(BUILD)/moe bench

test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

test-fast: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) -L fast

# The Python package's torch / transformers tests (ctest label python): a venv with the pinned
# versions of tests/fixtures/VERSIONS.txt (scripts/install-python-test-deps.sh; torch is ~3 GB),
# the build configured to run them with it (MOE_PYTHON_TORCH, kept in the cache: a later
# `make test` runs them too), then `ctest -L python`. `make test` alone needs no torch.
PYTHON_VENV ?= $(BUILD)/venv-python
test-python: deps
	@./scripts/install-python-test-deps.sh $(PYTHON_VENV) >/dev/null
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) -DMOE_PYTHON_TORCH=$(abspath $(PYTHON_VENV))/bin/python >/dev/null
	cmake --build $(BUILD) -j$(JOBS)
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) -L python

# AddressSanitizer + UndefinedBehaviorSanitizer build, fast tier.
test-asan: deps
	cmake -S . -B build-asan $(CMAKE_FLAGS) -DMOE_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
	cmake --build build-asan -j$(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j$(JOBS) -L fast

# ThreadSanitizer build (-DMOE_TSAN=ON, without MPI, whose library is not instrumented): the
# tests that share one ctx, plan and weights between pthreads. Their ctx has one OpenMP thread,
# so no libgomp team (libgomp is not TSan-instrumented either) runs inside them.
TSAN_TESTS ?= test_threads
test-tsan: deps
	cmake -S . -B build-tsan $(CMAKE_FLAGS) -DMOE_TSAN=ON -DMOE_WITH_MPI=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build build-tsan -j$(JOBS) --target $(TSAN_TESTS)
	cd build-tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ctest --output-on-failure -j$(JOBS) -R '^($(subst $(eval) ,|,$(TSAN_TESTS)))$$'

# Without MPI (-DMOE_WITH_MPI=OFF): the same symbols, one-process plans; fast tier.
test-nompi: deps
	cmake -S . -B build-nompi $(CMAKE_FLAGS) -DMOE_WITH_MPI=OFF >/dev/null
	cmake --build build-nompi -j$(JOBS)
	cd build-nompi && ctest --output-on-failure -j$(JOBS) -L fast

# libFuzzer targets (tests/fuzz, clang + ASan + UBSan) in build-fuzz. `make fuzz` runs each for
# FUZZ_SECONDS over a copy of its corpus in build-fuzz; `make fuzz-smoke` (CI) for
# FUZZ_SMOKE_SECONDS each. Either fails on a crash, leak or timeout (tests/fuzz/README.md).
FUZZ_SECONDS ?= 60
FUZZ_SMOKE_SECONDS ?= 15
FUZZ_TARGETS ?= fuzz_safetensors fuzz_config_plan fuzz_model fuzz_index fuzz_input

fuzz-build: deps
	CC=clang cmake -S . -B build-fuzz -DMOE_FUZZ=ON -DMOE_BUILD_TESTS=OFF -DMOE_WITH_MPI=OFF \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython3_EXECUTABLE=$(shell command -v python3) >/dev/null
	cmake --build build-fuzz -j$(JOBS) --target $(FUZZ_TARGETS)

fuzz: fuzz-build
	./tests/fuzz/run.sh build-fuzz $(FUZZ_SECONDS) $(FUZZ_TARGETS)

fuzz-smoke: fuzz-build
	./tests/fuzz/run.sh build-fuzz $(FUZZ_SMOKE_SECONDS) $(FUZZ_TARGETS)

clean:
	rm -rf $(BUILD) build-asan build-tsan build-nompi build-fuzz
