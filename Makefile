# llmsd — one Makefile for everything.
#
#   make            build the engine library, tools and benchmarks (release)
#   make check      install build deps, build, run all tests (release + ASan/UBSan)
#   make run        build and show the engine generating text
#   make fuzz       build the libFuzzer targets (clang)
#   make bench      build the benchmarks
#
# Sources are found by convention, so adding a file needs no Makefile edit:
#   engine/*.c          -> libengine.a   (files named *_avx2.c get AVX2/FMA/F16C flags
#                                          and must only be called after a CPU check)
#   tools/*.c           -> one program each
#   bench/*.c           -> one program each
#   tests/**/test_*.c   -> one test program each, linked with tests/support/*.c
#   tests/fuzz/fuzz_*.c -> one libFuzzer target each

CC       ?= cc
BUILD    ?= build
OPT      ?= -O2
SANITIZE ?=

DEPS_CFLAGS := $(shell pkg-config --cflags openblas libpcre2-8 2>/dev/null)
DEPS_LIBS   := $(shell pkg-config --libs openblas libpcre2-8 2>/dev/null)

CFLAGS  := -std=gnu11 -Wall -Wextra -Werror $(OPT) -g -pthread -fPIC \
           -D_GNU_SOURCE -I. $(DEPS_CFLAGS) $(SANITIZE) $(EXTRA_CFLAGS)
LDFLAGS := -pthread $(SANITIZE)
LDLIBS  := $(DEPS_LIBS) -lm

AVX2_FLAGS := -mavx2 -mfma -mf16c

ENGINE_SRC  := $(wildcard engine/*.c)
ENGINE_OBJ  := $(ENGINE_SRC:%.c=$(BUILD)/%.o)
ENGINE_LIB  := $(BUILD)/libengine.a

TOOL_SRC    := $(wildcard tools/*.c)
TOOL_BIN    := $(TOOL_SRC:tools/%.c=$(BUILD)/%)

BENCH_SRC   := $(wildcard bench/*.c)
BENCH_BIN   := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)

TEST_SUPPORT_SRC := $(wildcard tests/support/*.c)
TEST_SUPPORT_OBJ := $(TEST_SUPPORT_SRC:%.c=$(BUILD)/%.o)
TEST_SRC    := $(shell find tests -name 'test_*.c' -not -path 'tests/fuzz/*' | sort)
TEST_BIN    := $(TEST_SRC:%.c=$(BUILD)/%)

FUZZ_SRC    := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BIN    := $(FUZZ_SRC:tests/fuzz/%.c=$(BUILD)/fuzz/%)

.PHONY: all deps check test tests run fuzz bench clean
.DELETE_ON_ERROR:
.SECONDARY:

all: $(ENGINE_LIB) $(TOOL_BIN) $(BENCH_BIN)

deps:
	@sh scripts/install-deps.sh

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(if $(findstring _avx2,$<),$(AVX2_FLAGS)) -MMD -MP -c $< -o $@

$(ENGINE_LIB): $(ENGINE_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/%: $(BUILD)/tools/%.o $(ENGINE_LIB)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/bench/%: $(BUILD)/bench/%.o $(ENGINE_LIB)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(TEST_SUPPORT_OBJ) $(ENGINE_LIB)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

tests: $(TEST_BIN) $(TOOL_BIN)

bench: $(BENCH_BIN)

# The whole suite: release build, then the same tests built with ASan/UBSan.
check: deps
	@$(MAKE) --no-print-directory all tests
	@$(MAKE) --no-print-directory BUILD=build/asan OPT=-O1 \
	    SANITIZE="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" tests
	@sh tests/run.sh build build/asan

# Fuzz targets need clang's libFuzzer; they are built with the engine sources directly.
$(BUILD)/fuzz/%: tests/fuzz/%.c $(ENGINE_SRC)
	@mkdir -p $(dir $@)
	clang -std=gnu11 -g -O1 -pthread -I. $(DEPS_CFLAGS) $(AVX2_FLAGS) \
	    -fsanitize=fuzzer,address,undefined $^ $(DEPS_LIBS) -lm -o $@

fuzz: $(FUZZ_BIN)

run: deps all
	@sh scripts/demo.sh

clean:
	rm -rf build

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
