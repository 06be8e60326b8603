// nccl_check.h: an NCCL call's failure as one message with what to check, for every NCCL user
// (multi_gpu.cuh, the context-parallel ring).
#ifndef NCCL_CHECK_H
#define NCCL_CHECK_H

#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

// Exits with file, line, NCCL's message and what to check when an NCCL call fails.
static inline void nccl_check(ncclResult_t r, const char* file, int line) {
    if (r == ncclSuccess) return;
    const char* last = ncclGetLastError(NULL);
    fprintf(stderr, "error: NCCL call failed at %s:%d: %s%s%s\n", file, line, ncclGetErrorString(r),
            last && *last ? ": " : "", last ? last : "");
    const char* hint = "rerun with NCCL_DEBUG=INFO (and NCCL_DEBUG_SUBSYS=INIT,NET) to see which rank and transport "
                       "failed";
    switch (r) {
        case ncclUnhandledCudaError:
            hint = "a CUDA call inside NCCL failed: check that every rank sees its own GPU (LOCAL_RANK, "
                   "CUDA_VISIBLE_DEVICES) and rerun with NCCL_DEBUG=INFO";
            break;
        case ncclSystemError:
            hint = "a system call (sockets, shared memory) failed: check /dev/shm space and the network interface "
                   "(NCCL_SOCKET_IFNAME), and rerun with NCCL_DEBUG=INFO";
            break;
        case ncclRemoteError:
            hint = "another rank failed or exited: look at its error first";
            break;
        case ncclInvalidArgument:
        case ncclInvalidUsage:
            hint = "NCCL was called wrongly (a bug in train_gpt, or ranks disagree on sizes): report it with the "
                   "command lines of every rank";
            break;
        default: break;
    }
    fprintf(stderr, "hint: %s\n", hint);
    exit(EXIT_FAILURE);
}
#define NCCL_CHECK(call) nccl_check((call), __FILE__, __LINE__)

#endif  // NCCL_CHECK_H
