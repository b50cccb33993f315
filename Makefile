# The two front-door commands. Everything else is CMake (build/) and ctest.
#   make run   build, then run the main job: the embedded Qwen3-30B-A3B layer benchmark
#   make test  build, then run the whole test suite
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?= -DMOE_WERROR=ON -DPython3_EXECUTABLE=$(shell command -v python3)

.PHONY: all deps build run test test-fast test-asan test-tsan test-nompi clean

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

clean:
	rm -rf $(BUILD) build-asan build-tsan build-nompi
