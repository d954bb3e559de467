# A thin wrapper over CMake so a new user types `make run` or `make test`.
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
PREFIX ?= /usr/local
CMAKE_FLAGS ?=

.PHONY: all deps build install run test test-asan test-tsan bench clean

all: build

deps:
	@scripts/deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

# CMAKE_FLAGS on an existing build directory configures it again, so that
# `make CMAKE_FLAGS=-DLK_NATIVE=ON` takes (the setting then stays in its cache).
build: deps $(BUILD)/CMakeCache.txt
ifneq ($(strip $(CMAKE_FLAGS)),)
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
endif
	@cmake --build $(BUILD) -j $(JOBS)

# The library, headers, the lockstep program and lockstep.pc under PREFIX
# (a user program then builds with `pkg-config --cflags --libs lockstep`).
install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

# The main job: the autoencoder on Fashion-MNIST, DDP on 2 CPU processes.
# Only the program is built first (a fresh clone's first result comes that
# much sooner); `make test` builds the tests and the rest.
run: deps $(BUILD)/CMakeCache.txt
ifneq ($(strip $(CMAKE_FLAGS)),)
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null
endif
	@cmake --build $(BUILD) -j $(JOBS) --target lockstep
	@scripts/run.sh $(BUILD)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

# The whole suite under AddressSanitizer + UndefinedBehaviorSanitizer.
test-asan: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DLK_SANITIZE=address $(CMAKE_FLAGS)
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS) -LE nosan $(CTEST_ARGS)

# The threaded parts under ThreadSanitizer.
test-tsan: deps
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DLK_SANITIZE=thread $(CMAKE_FLAGS)
	cmake --build build-tsan -j $(JOBS)
	# OpenMPI itself is not ThreadSanitizer-clean (its tcp transport), so the mpi tests stay out;
	# oneDNN's uninstrumented primitive cache is suppressed (tests/sanitizer_thread.supp says why).
	cd build-tsan && TSAN_OPTIONS="suppressions=$(CURDIR)/tests/sanitizer_thread.supp $$TSAN_OPTIONS" \
	  ctest --output-on-failure -j $(JOBS) -L threads -LE mpi $(CTEST_ARGS)

bench: build
	$(BUILD)/lockstep bench ops

clean:
	rm -rf $(BUILD) build-asan build-tsan
