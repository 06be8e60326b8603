// gpt_inference_model.cuh: a GPTModel with only what generation needs: the bf16 weights (one
// allocation cut into the 16 tensors, as gpt_model_create cuts them), the cuBLASLt context and the
// attention backend's context. No gradients, no activations (the decoder and the prefill own theirs,
// gpt_decode.cuh, gpt_prefill.cuh), no optimizer state: a model generates on a GPU that could not
// train it. gpt_model_destroy frees it (it frees what is there).
#ifndef GPT_INFERENCE_MODEL_CUH
#define GPT_INFERENCE_MODEL_CUH

#include "layers/model/gpt_model.cuh"

// Creates the inference-only model of `config` whose prefill runs `backend`, on `stream`; the
// weights are left zero for the caller to load. Returns 0, or -1 after printing "error: ..." for an
// unusable config; CUDA errors exit.
static int gpt_inference_model_create(GPTModel* m, const GPTConfig* config, AttentionBackend backend,
                                      cudaStream_t stream) {
    memset(m, 0, sizeof(*m));
    const GPTModelOptions o = gpt_model_options(1, 1, backend, stream);  // a shape only for the checks
    if (gpt_model_check(config, &o) != 0) return -1;
    gpt_model_set_shape(m, config, &o);
    m->stream = stream;
    gpt_param_sizes(m->param_sizes, config);
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        m->param_offsets[i] = m->num_params;
        m->num_params += m->param_sizes[i];
    }
    m->num_params_padded = m->num_params;
    const size_t bytes = m->num_params * sizeof(__nv_bfloat16);
    cuda_malloc_or_explain((void**)&m->params, bytes, "the bf16 weights", "use a GPU with more memory");
    CUDA_CHECK(cudaMemsetAsync(m->params, 0, bytes, stream));
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) m->param_tensors[i] = m->params + m->param_offsets[i];
    m->precision = PRECISION_BF16;
    matmul_context_create(&m->matmul, stream);
    m->matmul.tune = 0;  // fixed GEMM choices: the same bits, so the same tokens, in every process
    if (attention_uses_cublas(backend)) {
        CUBLAS_CHECK(cublasCreate(&m->att_ctx.cublas));
        CUBLAS_CHECK(cublasSetStream(m->att_ctx.cublas, stream));
    }
    return 0;
}

#endif  // GPT_INFERENCE_MODEL_CUH
