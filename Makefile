# The two front-door commands. Everything else is CMake (build/) and ctest.
#   make run   build, then run the main job: the embedded Qwen3-30B-A3B layer benchmark
#   make test  build, then run the whole test suite
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?= -DMOE_WERROR=ON -DPython3_EXECUTABLE=$(shell command -v python3)

.PHONY: all deps build run test test-fast test-asan test-nompi fuzz-build fuzz fuzz-smoke clean

all: build

deps:
	@./scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j$(JOBS)

run: build
	./$(BUILD)/moe bench

test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

test-fast: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) -L fast

# AddressSanitizer + UndefinedBehaviorSanitizer build, fast tier.
test-asan: deps
	cmake -S . -B build-asan $(CMAKE_FLAGS) -DMOE_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
	cmake --build build-asan -j$(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j$(JOBS) -L fast

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
	rm -rf $(BUILD) build-asan build-nompi build-fuzz
