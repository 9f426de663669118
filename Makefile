# The two commands of the quick start:
#   make demo   install what is missing, build, train gpt2-tiny with ZeRO-2 on 2 ranks
#   make test   install what is missing, build, run the whole test suite
BUILD ?= build

.PHONY: all setup build test demo clean
all: build
setup:
	@scripts/setup.sh >/dev/null
build:
	@scripts/build.sh $(BUILD)
test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 1200
demo: build
	@scripts/demo.sh $(BUILD)
clean:
	rm -rf $(BUILD)
