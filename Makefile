# The two commands of the quick start:
#   make demo   install what is missing, build, train gpt2-tiny with ZeRO-2 on 2 ranks
#   make test   install what is missing, build, run the whole test suite
# CI runs `make test SANITIZE=1`: the same suite built with AddressSanitizer and
# UndefinedBehaviorSanitizer (SANITIZE=1 means address,undefined) in build-san/.
SANITIZE ?=
ifeq ($(SANITIZE),1)
  override SANITIZE := address,undefined
endif
ifneq ($(SANITIZE),)
  BUILD ?= build-san
  CMAKE_ARGS += -DZT_SANITIZE=$(SANITIZE)
  # What the CPU suite runs (the benchmarks, examples and GPU tests are not run there).
  export ZT_BUILD_TARGETS := zerotrain_cli zerotrain_rank zt_unit zt_dist
else
  BUILD ?= build
endif

.PHONY: all setup build test demo clean
all: build
setup:
	@scripts/setup.sh >/dev/null
build:
	@scripts/build.sh $(BUILD) $(CMAKE_ARGS)
test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 1200 -j2
demo: build
	@scripts/demo.sh $(BUILD)
clean:
	rm -rf $(BUILD)
