// tensor_map.h: TMA tensor maps (CUtensorMap) for the attention tensors, made on the host.
//
// Every attention tensor is a set of rows (b, t, h) of HD contiguous bf16 at
// ptr + (b·T + t)·row_stride + h·HD (attention.h), so one rank-4 map covers any layout, packed
// (B, T, 3, NH, HD) or plain (B, T, NH, HD): dimensions (HD, NH, T, B), innermost first, with byte
// strides (HD·2, row_stride·2, T·row_stride·2). A box is `box_cols` columns × 1 head × `box_rows`
// rows × 1 batch, so a copy never crosses into another head or sequence, and TMA zero-fills the rows
// past T of a load and drops them from a store. The swizzle is the one wgmma reads (wgmma.cuh's
// WgTile): 128-byte rows of 64 columns, or 32-byte rows of 16 columns for head dims 80 and 96.
//
// cuTensorMapEncodeTiled is a driver function; it is reached through the runtime's entry-point
// query so that the program does not link libcuda itself.
#ifndef TENSOR_MAP_H
#define TENSOR_MAP_H

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "attention/common/cuda_check.h"

static inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(void) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = NULL;
    if (!encode) {
        void* fn = NULL;
        cudaDriverEntryPointQueryResult found;
        ATTN_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
        if (found != cudaDriverEntryPointSuccess || !fn) {
            fprintf(stderr, "error: the CUDA driver has no cuTensorMapEncodeTiled (needed by flash2 on Hopper); "
                            "update the NVIDIA driver to one for CUDA 12 or newer\n");
            exit(EXIT_FAILURE);
        }
        encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    }
    return encode;
}

// A map of rows (b, t, h) of `hd` bf16 (see above); boxes of box_rows × box_cols, box_cols·2 bytes
// being the swizzle width (128, 64 or 32).
static inline CUtensorMap make_rows_tensor_map(const void* ptr, int B, int T, int NH, int hd, long row_stride,
                                               int box_rows, int box_cols) {
    CUtensorMap map;
    const cuuint64_t dims[4] = {(cuuint64_t)hd, (cuuint64_t)NH, (cuuint64_t)T, (cuuint64_t)B};
    const cuuint64_t strides[3] = {(cuuint64_t)hd * 2, (cuuint64_t)row_stride * 2, (cuuint64_t)T * row_stride * 2};
    const cuuint32_t box[4] = {(cuuint32_t)box_cols, 1, (cuuint32_t)box_rows, 1};
    const cuuint32_t element_strides[4] = {1, 1, 1, 1};
    const CUtensorMapSwizzle swizzle = box_cols * 2 == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                                       : box_cols * 2 == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                                            : CU_TENSOR_MAP_SWIZZLE_32B;
    const CUresult r = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, (void*)ptr, dims, strides, box,
                                            element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr,
                "error: cuTensorMapEncodeTiled failed (%d) for a (B %d, T %d, NH %d, HD %d) tensor at %p with row "
                "stride %ld: flash2's Hopper kernels need 16-byte aligned rows; run with FLASH2_MMA_SYNC=1 to use "
                "the mma.sync kernels instead\n",
                (int)r, B, T, NH, hd, ptr, row_stride);
        exit(EXIT_FAILURE);
    }
    return map;
}

#endif  // TENSOR_MAP_H
