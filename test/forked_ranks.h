// forked_ranks.h: the multi-rank GPU tests' processes: one forked child per GPU, meeting through a file
// rendezvous in a fresh directory (no port to collide with another run), each writing its results
// as lines to DIR/rankR.txt for the parent, which reports the cases.
//
// The parent must not start CUDA before it forks (a forked child cannot use a CUDA context of its
// parent): forked_count_gpus asks in a child. Used by test_gpu_multi_gpu.cu and
// test_gpu_context_parallel.cu.
#ifndef FORKED_RANKS_H
#define FORKED_RANKS_H

#include <cuda_runtime.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "layers/cuda_common.h"
#include "layers/multi_gpu/launcher.h"

#define FORKED_MAX_WORLD 16
#define FORKED_PATH_MAX 4200

// How many CUDA GPUs there are, asked in a child; 0 when any is older than compute capability
// min_major (0: any).
static int forked_count_gpus(int min_major) {
    const pid_t pid = fork();
    if (pid == 0) {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
        for (int d = 0; d < n; d++) {
            cudaDeviceProp prop;
            if (cudaGetDeviceProperties(&prop, d) != cudaSuccess || prop.major < min_major) n = 0;
        }
        _exit(n > 100 ? 100 : n);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}

static void forked_rank_path(char* path, size_t size, const char* dir, int rank) {
    snprintf(path, size, "%s/rank%d.txt", dir, rank);
}

// What launcher.h's rendezvous needs to know of a forked rank (the port is unused: file rendezvous).
static LaunchInfo forked_launch_info(int rank, int world) {
    LaunchInfo li;
    memset(&li, 0, sizeof(li));
    li.rank = rank, li.world = world, li.local_rank = rank, li.source = "test (forked ranks)";
    snprintf(li.master_addr, sizeof(li.master_addr), "127.0.0.1");
    li.master_port = 29500;
    return li;
}

// The start of a rank: output to stderr only (the parent prints the case lines), a deadline (a hang
// ends the rank by SIGALRM; the parent reports it), NVLink multicast off unless the caller says
// otherwise, its GPU. Returns its lines' file (exits 3 when it cannot be made).
static FILE* forked_rank_begin(int rank, const char* dir) {
    dup2(STDERR_FILENO, STDOUT_FILENO);
    alarm(300);
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    char path[FORKED_PATH_MAX];
    forked_rank_path(path, sizeof(path), dir, rank);
    FILE* out = fopen(path, "w");
    if (!out) _exit(3);
    CUDA_CHECK(cudaSetDevice(rank));
    return out;
}

static void forked_remove_dir(const char* dir) {
    DIR* d = opendir(dir);
    struct dirent* e;
    char path[FORKED_PATH_MAX];
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            snprintf(path, sizeof(path), "%s/%s", dir, e->d_name), unlink(path);
    if (d) closedir(d);
    rmdir(dir);
}

// Forks `world` ranks running rank_main(rank, world, dir) (which must _exit) and waits for all;
// codes[r]: rank r's exit status (128 + the signal when one ended it, 255 when it could not start).
static void forked_run(int world, const char* dir, void (*rank_main)(int rank, int world, const char* dir),
                       int* codes) {
    fflush(stdout);
    pid_t pids[FORKED_MAX_WORLD];
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) rank_main(r, world, dir);
    }
    for (int r = 0; r < world; r++) {
        int status = 0;
        if (pids[r] < 0 || waitpid(pids[r], &status, 0) != pids[r]) status = 255 << 8;
        codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
}

#endif  // FORKED_RANKS_H
