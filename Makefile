# Makefile: build the trainer, prepare the default dataset, build and run the tests.
#
#   make train       build ./train_gpt and prepare data/tinyshakespeare/ if it is missing
#   make test        build everything and run every test (GPU tests skip without a GPU)
#   make clean       remove build outputs (prepared data and .venv stay)
#
# Variables: GPU_ARCH (default "80 90a": compute capabilities to build CUDA code for),
# NVCC, CC, PYTHON3, SHARED_DATA (a folder of offline copies of Tiny Shakespeare and the BPE ranks).

NVCC ?= nvcc
CC := $(if $(filter default,$(origin CC)),gcc,$(CC))
PYTHON3 ?= python3
GPU_ARCH ?= 80 90a

BUILD := build
VENV := .venv
PY := $(VENV)/bin/python

GENCODE := $(foreach arch,$(GPU_ARCH),-gencode arch=compute_$(arch),code=sm_$(arch))
NVCC_FLAGS := -O3 -std=c++17 -lineinfo $(GENCODE) -I. -Xcompiler -Wall,-Wextra
# Tests are C built with the sanitizers: an out-of-bounds read is a failure, not a silent pass.
TEST_CFLAGS := -std=c11 -O2 -g -Wall -Wextra -Werror -fsanitize=address,undefined -fno-omit-frame-pointer -I.
DEPFLAGS = -MMD -MP

# Offline machines: a folder SHARED_DATA (default ../shared/data, beside the checkout) holding
# tinyshakespeare.txt and tiktoken_cache/ (tiktoken's cache of the GPT-2 BPE ranks); when it is
# there, the dataset and the tests take them from it, over any TIKTOKEN_CACHE_DIR already set
# (scripts/prepare_data.py downloads them otherwise; the tests that need them skip).
SHARED_DATA ?= ../shared/data
ifneq ($(wildcard $(SHARED_DATA)/tiktoken_cache),)
export TIKTOKEN_CACHE_DIR := $(abspath $(SHARED_DATA)/tiktoken_cache)
endif
TINYSHAKESPEARE_TXT := $(wildcard $(SHARED_DATA)/tinyshakespeare.txt)
DATASET := data/tinyshakespeare/tinyshakespeare_val_000000.bin

CPU_TESTS := $(BUILD)/test_cpu_reference $(BUILD)/test_gpt_config $(BUILD)/test_dataloader $(BUILD)/test_checkpoint \
             $(BUILD)/test_launcher $(BUILD)/test_stop_signal $(BUILD)/test_tokenizer $(BUILD)/test_prompt_tokens \
             $(BUILD)/test_watchdog $(BUILD)/test_eval_file $(BUILD)/test_zigzag
TEST_LIBS := $(BUILD)/libcpu_gpt.so
GPU_TESTS := $(BUILD)/test_gpu_build $(BUILD)/test_gpu_attention $(BUILD)/test_gpu_matmul $(BUILD)/test_gpu_layers \
             $(BUILD)/test_gpu_gpt $(BUILD)/test_gpu_recompute $(BUILD)/test_gpu_decode $(BUILD)/test_gpu_multi_gpu \
             $(BUILD)/test_gpu_generate $(BUILD)/test_gpu_fp8 $(BUILD)/test_gpu_context_parallel \
             $(BUILD)/test_gpu_decode_linear
# Attention backends: one object per file, so editing one kernel rebuilds only that file.
ATTN_OBJS := $(BUILD)/attention.o $(BUILD)/attention_naive.o $(BUILD)/flash1_forward.o $(BUILD)/flash1_backward.o \
             $(BUILD)/flash2_forward.o $(BUILD)/flash2_backward.o $(BUILD)/flash2_decode.o \
             $(BUILD)/kv_cache.o
TOOLS := $(BUILD)/attention_tool $(BUILD)/libattention.so $(BUILD)/libdecode.so $(BUILD)/flash2_tune $(BUILD)/train_gpt_no_nccl \
         $(BUILD)/gpu_ceilings $(BUILD)/sanitize_kernels $(BUILD)/bench_fp8_gemm $(BUILD)/bench_decode_linear \
         $(BUILD)/train_gpt_trace

.PHONY: all train test dataset venv clean
.DELETE_ON_ERROR:
.SECONDARY:  # keep object files between builds (incremental)

all: train_gpt $(CPU_TESTS) $(TEST_LIBS) $(GPU_TESTS) $(TOOLS)

train: train_gpt $(DATASET)

dataset: $(DATASET)

venv: $(VENV)/.installed

# The Python tests read the data folder as SHARED_DATA_DIR (an absolute path: they run from elsewhere too);
# without it, only their cases that need the text or the BPE ranks skip, and say so.
test: train_gpt $(CPU_TESTS) $(TEST_LIBS) $(GPU_TESTS) $(TOOLS) $(VENV)/.installed
	BUILD=$(BUILD) PYTHON=$(PY) SHARED_DATA_DIR='$(abspath $(SHARED_DATA))' bash test/run_tests.sh

# ---- trainer -----------------------------------------------------------------------------------
# NCCL (multi-GPU): the CUDA toolkit's, or NCCL_INCLUDE="-I/path/to/nccl/include" and
# NCCL_LIBS="-L/path/to/nccl/lib -lnccl"; at run time libnccl.so.2 must be found (LD_LIBRARY_PATH),
# e.g. the one in PyTorch's nvidia-nccl wheel. NCCL=1 or 0 by default says whether a program
# including nccl.h links here; without NCCL train_gpt is built for one GPU (and says so), and a
# launch of several processes stops with a message. build/train_gpt_no_nccl is always that build
# (the tests check it).
NCCL_LIBS ?= -lnccl
NCCL_INCLUDE ?=
CUDA_HOME ?= $(patsubst %/bin/,%,$(dir $(shell command -v $(NVCC) 2>/dev/null)))
ifeq ($(origin NCCL),undefined)
NCCL := $(shell printf '\043include <nccl.h>\nint main(void) { int v; return ncclGetVersion(&v); }\n' | \
          $(CC) -x c - -o /dev/null -I$(CUDA_HOME)/include $(NCCL_INCLUDE) -L$(CUDA_HOME)/lib64 $(NCCL_LIBS) \
          >/dev/null 2>&1 && echo 1 || echo 0)
endif
ifeq ($(NCCL),1)
TRAIN_GPT_NCCL_FLAGS := $(NCCL_INCLUDE)
TRAIN_GPT_NCCL_LIBS := $(NCCL_LIBS)
else
TRAIN_GPT_NCCL_FLAGS := -DTRAIN_GPT_NO_NCCL
TRAIN_GPT_NCCL_LIBS :=
$(info make: $(if $(filter command line,$(origin NCCL)),NCCL=0,NCCL not found (nccl.h and -lnccl)): train_gpt is built for one GPU; for multi-GPU install NCCL, or set NCCL_INCLUDE and NCCL_LIBS)
endif
# A stamp file per NCCL setting, so train_gpt is rebuilt when it changes between 1 and 0.
NCCL_STAMP := $(BUILD)/nccl_$(NCCL)
$(NCCL_STAMP): | $(BUILD)
	rm -f $(BUILD)/nccl_[01]
	touch $@

# The commit the trainers are built from (+ "-dirty" when tracked files differ from it; GIT_COMMIT=...
# names it where the tree's git metadata is stale or absent) and the GPU targets, for the plan and
# --version: build/build_info.c is rewritten only when they change, so a new commit relinks the
# trainers without compiling them again. The links take only the objects of their prerequisites: an
# older build's dependency file may still list headers as the trainer's own.
BUILD_COMMIT := $(or $(GIT_COMMIT),$(shell git rev-parse --short=12 HEAD 2>/dev/null)$(shell git rev-parse \
                --git-dir >/dev/null 2>&1 && ! git diff --quiet HEAD -- 2>/dev/null && echo -dirty),unknown)
BUILD_INFO := $(BUILD_COMMIT), built for $(foreach arch,$(GPU_ARCH),sm_$(arch))
$(BUILD)/build_info.c: FORCE | $(BUILD)
	@printf 'const char train_gpt_build[] = "%s";\n' '$(BUILD_INFO)' >$@.tmp
	@if cmp -s $@.tmp $@; then rm -f $@.tmp; else mv $@.tmp $@; fi
$(BUILD)/build_info.o: $(BUILD)/build_info.c
	$(CC) -c -o $@ $<
.PHONY: FORCE
FORCE:

$(BUILD)/train_gpt.o: train_gpt.cu $(NCCL_STAMP) | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) $(TRAIN_GPT_NCCL_FLAGS) -MD -MP -MF $(BUILD)/train_gpt.d -c -o $@ $<
train_gpt: $(BUILD)/train_gpt.o $(ATTN_OBJS) $(BUILD)/build_info.o
	$(NVCC) $(NVCC_FLAGS) -o $@ $(filter %.o,$^) -lcublasLt -lcublas $(TRAIN_GPT_NCCL_LIBS)

# The one-GPU build, without NCCL, whatever this machine has (the tests check its refusal of a
# multi-process launch).
$(BUILD)/train_gpt_no_nccl.o: train_gpt.cu | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) -DTRAIN_GPT_NO_NCCL -MD -MP -MF $(BUILD)/train_gpt_no_nccl.d -c -o $@ $<
$(BUILD)/train_gpt_no_nccl: $(BUILD)/train_gpt_no_nccl.o $(ATTN_OBJS) $(BUILD)/build_info.o
	$(NVCC) $(NVCC_FLAGS) -o $@ $(filter %.o,$^) -lcublasLt -lcublas

# ---- attention backends, the attention tool and the library the Python scripts load ---------------
# Every attention source folder compiles to build/ (object names are unique across the folders).
ATTN_SRC_DIRS := attention attention/naive attention/flash1 attention/flash2 attention/decode attention/tools
define attention_object_rule
$$(BUILD)/%.o: $(1)/%.cu | $$(BUILD)
	$$(NVCC) $$(NVCC_FLAGS) -Xcompiler -fPIC -MD -MP -MF $$(BUILD)/$$*.d -c -o $$@ $$<
endef
$(foreach dir,$(ATTN_SRC_DIRS),$(eval $(call attention_object_rule,$(dir))))

$(BUILD)/attention_tool: attention/tools/attention_tool.cu $(ATTN_OBJS) | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) -MD -MP -MF $(BUILD)/attention_tool.d -o $@ $< $(ATTN_OBJS) -lcublas

# Times candidate flash2 block shapes (a development tool; built so that it keeps compiling).
$(BUILD)/flash2_tune: attention/tools/flash2_tune.cu | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) -MD -MP -MF $(BUILD)/flash2_tune.d -o $@ $<

# The GEMM and copy ceilings scripts/profile_step.py compares the step's kernels against.
$(BUILD)/gpu_ceilings: layers/tools/gpu_ceilings.cu | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) -MD -MP -MF $(BUILD)/gpu_ceilings.d -o $@ $< -lcublasLt

# The linear layers' GEMMs in bf16 and FP8 and the FP8 casts, timed (`build/bench_fp8_gemm --help`).
$(BUILD)/bench_fp8_gemm: layers/tools/bench_fp8_gemm.cu | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) -MD -MP -MF $(BUILD)/bench_fp8_gemm.d -o $@ $< -lcublasLt

# The decode step's linear layers at 1-16 rows: decode_linear against cuBLASLt and the copy rate
# (`build/bench_decode_linear --help`).
$(BUILD)/bench_decode_linear: layers/tools/bench_decode_linear.cu | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) -MD -MP -MF $(BUILD)/bench_decode_linear.d -o $@ $< -lcublasLt

# train_gpt with the decode step's per-block timeline compiled in (-DKERNEL_TRACE): `GPT_TRACE_FILE=t.csv
# build/train_gpt_trace --generate ...`, then `scripts/decode_trace.py t.csv` (layers/generate/decode_trace.cuh).
TRACE_OBJS := $(filter-out $(BUILD)/flash2_decode.o,$(ATTN_OBJS)) $(BUILD)/flash2_decode_trace.o
$(BUILD)/flash2_decode_trace.o: attention/decode/flash2_decode.cu | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) -DKERNEL_TRACE -MD -MP -MF $(BUILD)/flash2_decode_trace.d -c -o $@ $<
$(BUILD)/train_gpt_trace.o: train_gpt.cu $(NCCL_STAMP) | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) -DKERNEL_TRACE $(TRAIN_GPT_NCCL_FLAGS) -MD -MP -MF $(BUILD)/train_gpt_trace.d -c -o $@ $<
$(BUILD)/train_gpt_trace: $(BUILD)/train_gpt_trace.o $(TRACE_OBJS) $(BUILD)/build_info.o
	$(NVCC) $(NVCC_FLAGS) -o $@ $(filter %.o,$^) -lcublasLt -lcublas $(TRAIN_GPT_NCCL_LIBS)

$(BUILD)/libattention.so: $(ATTN_OBJS) $(BUILD)/attention_flat_api.o
	$(NVCC) $(NVCC_FLAGS) -shared -o $@ $^ -lcublas

# The decoding attention alone, for scripts/bench_decode.py.
$(BUILD)/libdecode.so: $(BUILD)/flash2_decode.o $(BUILD)/kv_cache.o $(BUILD)/decode_flat_api.o
	$(NVCC) $(NVCC_FLAGS) -shared -o $@ $^

# ---- tests -------------------------------------------------------------------------------------
$(BUILD)/%.o: test/%.c | $(BUILD)
	$(CC) $(TEST_CFLAGS) $(DEPFLAGS) -c -o $@ $<

$(BUILD)/test_cpu_reference: $(BUILD)/test_cpu_reference.o $(BUILD)/cpu_reference.o $(BUILD)/cpu_gpt.o
	$(CC) $(TEST_CFLAGS) -o $@ $^ -lm

# The reference model as a shared library, for the Python checks (no sanitizers: Python loads it).
$(BUILD)/libcpu_gpt.so: test/cpu_reference.c test/cpu_gpt.c test/cpu_reference.h test/cpu_gpt.h data/gpt_config.h | $(BUILD)
	$(CC) -std=c11 -O2 -fPIC -shared -Wall -Wextra -Werror -I. -o $@ test/cpu_reference.c test/cpu_gpt.c -lm

$(BUILD)/test_%: $(BUILD)/test_%.o
	$(CC) $(TEST_CFLAGS) -o $@ $^ -lm

$(BUILD)/test_gpu_%: test/test_gpu_%.cu | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) -MD -MP -MF $(BUILD)/test_gpu_$*.d -o $@ $<

# GPU tests link nvcc code with the CPU reference, built here without sanitizers (nvcc links no ASan).
$(BUILD)/%_plain.o: test/%.c | $(BUILD)
	$(CC) -std=c11 -O2 -Wall -Wextra -Werror -I. $(DEPFLAGS) -c -o $@ $<

$(BUILD)/test_gpu_attention: test/test_gpu_attention.cu $(BUILD)/cpu_reference_plain.o $(ATTN_OBJS) | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) -MD -MP -MF $(BUILD)/test_gpu_attention.d -o $@ $< $(BUILD)/cpu_reference_plain.o $(ATTN_OBJS) -lcublas

$(BUILD)/test_gpu_decode: test/test_gpu_decode.cu $(BUILD)/flash2_decode.o $(BUILD)/kv_cache.o | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) -MD -MP -MF $(BUILD)/test_gpu_decode.d -o $@ $< $(BUILD)/flash2_decode.o $(BUILD)/kv_cache.o

$(BUILD)/test_gpu_matmul: test/test_gpu_matmul.cu $(BUILD)/cpu_reference_plain.o | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) -MD -MP -MF $(BUILD)/test_gpu_matmul.d -o $@ $< $(BUILD)/cpu_reference_plain.o -lcublasLt -lcublas

# The FP8 casts, scales and GEMMs (layers/model/fp8_cast.cuh, fp8_scaling.cuh, matmul_fp8.cuh).
$(BUILD)/test_gpu_fp8: test/test_gpu_fp8.cu | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) -MD -MP -MF $(BUILD)/test_gpu_fp8.d -o $@ $< -lcublasLt -lcublas

$(BUILD)/test_gpu_decode_linear: test/test_gpu_decode_linear.cu | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) -MD -MP -MF $(BUILD)/test_gpu_decode_linear.d -o $@ $< -lcublasLt -lcublas

$(BUILD)/test_gpu_layers: test/test_gpu_layers.cu $(BUILD)/cpu_reference_plain.o | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) -MD -MP -MF $(BUILD)/test_gpu_layers.d -o $@ $< $(BUILD)/cpu_reference_plain.o

$(BUILD)/test_gpu_gpt: test/test_gpu_gpt.cu $(BUILD)/cpu_reference_plain.o $(BUILD)/cpu_gpt_plain.o $(ATTN_OBJS) | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) -MD -MP -MF $(BUILD)/test_gpu_gpt.d -o $@ $< $(BUILD)/cpu_reference_plain.o $(BUILD)/cpu_gpt_plain.o \
		$(ATTN_OBJS) -lcublasLt -lcublas

$(BUILD)/test_gpu_recompute: test/test_gpu_recompute.cu $(BUILD)/cpu_reference_plain.o $(BUILD)/cpu_gpt_plain.o $(ATTN_OBJS) | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) -MD -MP -MF $(BUILD)/test_gpu_recompute.d -o $@ $< $(BUILD)/cpu_reference_plain.o \
		$(BUILD)/cpu_gpt_plain.o $(ATTN_OBJS) -lcublasLt -lcublas

# multi_gpu.cuh on one GPU through a one-rank NCCL communicator (skips in a build without NCCL).
$(BUILD)/test_gpu_multi_gpu: test/test_gpu_multi_gpu.cu $(ATTN_OBJS) $(NCCL_STAMP) | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) -MD -MP -MF $(BUILD)/test_gpu_multi_gpu.d -o $@ $< $(ATTN_OBJS) -lcublasLt -lcublas \
		$(TRAIN_GPT_NCCL_FLAGS) $(TRAIN_GPT_NCCL_LIBS)

# The ring attention of context parallelism (layers/context_parallel/) on 1, 2 and 4 forked ranks against
# flash2 on the whole sequence (skips in a build without NCCL, and where there are fewer GPUs).
$(BUILD)/test_gpu_context_parallel: test/test_gpu_context_parallel.cu $(BUILD)/cpu_reference_plain.o $(ATTN_OBJS) \
		$(NCCL_STAMP) | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) -MD -MP -MF $(BUILD)/test_gpu_context_parallel.d -o $@ $< $(BUILD)/cpu_reference_plain.o \
		$(ATTN_OBJS) -lcublas $(TRAIN_GPT_NCCL_FLAGS) $(TRAIN_GPT_NCCL_LIBS)

$(BUILD)/test_gpu_generate: test/test_gpu_generate.cu $(BUILD)/cpu_reference_plain.o $(BUILD)/cpu_gpt_plain.o $(ATTN_OBJS) | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) -MD -MP -MF $(BUILD)/test_gpu_generate.d -o $@ $< $(BUILD)/cpu_reference_plain.o \
		$(BUILD)/cpu_gpt_plain.o $(ATTN_OBJS) -lcublasLt -lcublas

# Every kernel family on small odd shapes, for scripts/sanitize.sh (compute-sanitizer). The launch
# entry points of the CUDA runtime are wrapped at link time, so the program can say which kernels ran.
SANITIZE_WRAP := $(foreach fn,cudaLaunchKernel __cudaLaunchKernel cudaLaunchKernelExC,-Xlinker --wrap=$(fn))
$(BUILD)/sanitize_kernels: test/sanitize_kernels.cu $(ATTN_OBJS) | $(BUILD)
	$(NVCC) $(NVCC_FLAGS) -MD -MP -MF $(BUILD)/sanitize_kernels.d -o $@ $< $(ATTN_OBJS) $(SANITIZE_WRAP) -lcublasLt -lcublas

# ---- fuzzing (make fuzz) -------------------------------------------------------------------------
# libFuzzer targets for the parsers of files a user hands us (test/fuzz/README.md): token shards,
# checkpoints, llm.c model files, the token table, --prompt-tokens files and --eval-data files, built with clang under
# ASan and UBSan (FUZZ_CC; needs libFuzzer's runtime: on Debian, apt-get install clang libclang-rt-dev).
#   make fuzz                     each target FUZZ_SECONDS (15) from a scratch copy of its seed corpus
#                                 (test/fuzz/corpus/<target>/); fails on any crash, leak or timeout
#   make fuzz FUZZ_SECONDS=600    longer; FUZZ_TARGETS="shard checkpoint" runs some of them only
#   make fuzz-seeds               rewrites the valid_* seeds with the project's own writers
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 15
FUZZ_TARGETS ?= shard checkpoint model_file tokenizer prompt_tokens eval_file
FUZZ_CFLAGS := -std=c11 -g -O1 -Wall -Wextra -Werror -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
               -fno-omit-frame-pointer -I.

.PHONY: fuzz fuzz-build fuzz-seeds fuzz-toolchain

fuzz: fuzz-build
	bash test/fuzz/run_fuzz.sh $(FUZZ_SECONDS) $(BUILD) $(FUZZ_TARGETS)

fuzz-build: $(FUZZ_TARGETS:%=$(BUILD)/fuzz_%)

fuzz-toolchain:
	@printf 'int LLVMFuzzerTestOneInput(const char* d, unsigned long n) { return d && n; }\n' | \
	    $(FUZZ_CC) -x c - -fsanitize=fuzzer -o /dev/null >/dev/null 2>&1 || \
	    { echo "make fuzz: $(FUZZ_CC) cannot link -fsanitize=fuzzer; install clang and libFuzzer's runtime" \
	           "(Debian: apt-get install clang libclang-rt-dev) or set FUZZ_CC" >&2; exit 1; }

$(BUILD)/fuzz_%: test/fuzz/fuzz_%.c | $(BUILD) fuzz-toolchain
	$(FUZZ_CC) $(FUZZ_CFLAGS) -MMD -MP -MF $(BUILD)/fuzz_$*.d -o $@ $<

$(BUILD)/make_fuzz_seeds: test/fuzz/make_seeds.c | $(BUILD) fuzz-toolchain
	$(FUZZ_CC) -std=c11 -g -O1 -Wall -Wextra -Werror -fsanitize=address,undefined -I. -MMD -MP \
	    -MF $(BUILD)/make_fuzz_seeds.d -o $@ $<

fuzz-seeds: $(BUILD)/make_fuzz_seeds
	$(BUILD)/make_fuzz_seeds test/fuzz/corpus

# ---- Python environment and data ---------------------------------------------------------------
$(VENV)/.installed: scripts/requirements.txt
	$(PYTHON3) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r scripts/requirements.txt
	touch $@

$(DATASET): | $(VENV)/.installed
	$(PY) scripts/prepare_data.py $(if $(TINYSHAKESPEARE_TXT),--input $(TINYSHAKESPEARE_TXT) --paragraph-docs --name tinyshakespeare)

$(BUILD):
	mkdir -p $@

clean:
	rm -rf $(BUILD) train_gpt

-include $(wildcard $(BUILD)/*.d)
