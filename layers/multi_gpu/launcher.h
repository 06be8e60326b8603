// launcher.h: who am I in a multi-process run, and the exchange of NCCL's unique id between the
// processes, in plain C (no CUDA, no MPI), so a CPU test can run it.
//
// launcher_detect reads the launcher's environment, first match wins:
//   torchrun style  RANK, WORLD_SIZE, LOCAL_RANK (optional), MASTER_ADDR, MASTER_PORT
//   mpirun (Open MPI) OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
//   srun (SLURM)    SLURM_PROCID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS), SLURM_LOCALID
//   mpirun (MPICH)  PMI_RANK, PMI_SIZE, MPI_LOCALRANKID
//   none of them    one process: rank 0 of world 1 (no rendezvous, no NCCL)
// MASTER_ADDR / MASTER_PORT name the rendezvous for every launcher (default 127.0.0.1:29500, right
// for one node; on several nodes set MASTER_ADDR to rank 0's host).
//
// launcher_rendezvous_keep: a small TCP exchange. Rank 0 listens on MASTER_PORT (all interfaces); every
// other rank connects to MASTER_ADDR:MASTER_PORT (retrying until the timeout) and sends
// (magic, rank, world, tag); rank 0 waits until all world − 1 ranks have said hello, checks that
// they agree on the world size and on `tag` (a hash of the options that must match) and that no
// rank appears twice, then sends every rank the payload (NCCL's 128-byte unique id). On any
// disagreement, or when not every rank arrives in time, rank 0 tells every connected rank why and
// all of them return -1 with one line in `err` (what happened and what to check); nothing here
// prints or exits, and nothing waits longer than the timeout (plus a few seconds on a client).
// It can leave the connections open afterwards (`keep`), for the watchdog's heartbeat
// (layers/multi_gpu/heartbeat.h). `--rendezvous file:PATH` exchanges the same things through files on a
// shared filesystem instead (below, "the file exchange"), for nodes that cannot reach each other's ports.
//
// Wire format (little-endian, 24-byte hello, 16-byte reply header + payload_bytes):
//   hello  uint32 magic 'GPTR', uint32 version, int32 rank, int32 world, uint64 tag
//   reply  uint32 magic, int32 status (LAUNCH_OK or an error below), int32 rank 0's world,
//          int32 detail (the offending rank, or how many arrived), then the payload (zero on error)
#ifndef LAUNCHER_H
#define LAUNCHER_H

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define LAUNCH_MAGIC 0x52545047u  // "GPTR"
#define LAUNCH_VERSION 1
#define LAUNCH_DEFAULT_PORT 29500
#define LAUNCH_MAX_PAYLOAD 1024

enum { LAUNCH_OK = 0, LAUNCH_WORLD_MISMATCH = 1, LAUNCH_DUPLICATE_RANK = 2, LAUNCH_TAG_MISMATCH = 3,
       LAUNCH_TIMEOUT = 4, LAUNCH_BAD_RANK = 5 };

typedef struct {
    int rank, world;
    int local_rank;        // -1 when the launcher does not say (the caller picks rank % GPUs)
    const char* source;    // "torchrun env", "mpirun", "srun" or "none"
    char master_addr[256];
    int master_port;
} LaunchInfo;

// Parses an environment variable as an int in [min, max]; 1 = found and good, 0 = unset, -1 = bad.
static inline int launcher_env_int(const char* name, int min, int max, int* out, char* err, size_t err_len) {
    const char* s = getenv(name);
    if (!s || !*s) return 0;
    char* end = NULL;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || v < min || v > max) {
        snprintf(err, err_len, "environment variable %s=\"%s\" is not a whole number in [%d, %d]", name, s, min, max);
        return -1;
    }
    *out = (int)v;
    return 1;
}

// Fills `info` from the environment (see the top). Returns 0, or -1 with the reason in err.
static inline int launcher_detect(LaunchInfo* info, char* err, size_t err_len) {
    memset(info, 0, sizeof(*info));
    info->rank = 0, info->world = 1, info->local_rank = -1, info->source = "none";
    static const struct { const char *rank, *world, *world2, *local, *source; } kinds[] = {
        {"RANK", "WORLD_SIZE", NULL, "LOCAL_RANK", "torchrun env"},
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", NULL, "OMPI_COMM_WORLD_LOCAL_RANK", "mpirun"},
        {"SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_LOCALID", "srun"},
        {"PMI_RANK", "PMI_SIZE", NULL, "MPI_LOCALRANKID", "mpirun (MPICH)"},
    };
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
        int rank = 0, world = 0, local = -1;
        int has_rank = launcher_env_int(kinds[k].rank, 0, 1 << 20, &rank, err, err_len);
        if (has_rank < 0) return -1;
        int has_world = launcher_env_int(kinds[k].world, 1, 1 << 20, &world, err, err_len);
        if (has_world < 0) return -1;
        if (has_world == 0 && kinds[k].world2) {
            has_world = launcher_env_int(kinds[k].world2, 1, 1 << 20, &world, err, err_len);
            if (has_world < 0) return -1;
        }
        if (has_rank == 0 && has_world == 0) continue;
        if (has_rank == 0 || has_world == 0) {
            snprintf(err, err_len, "%s is set but %s is not: set both (the %s launcher sets them)",
                     has_rank ? kinds[k].rank : kinds[k].world, has_rank ? kinds[k].world : kinds[k].rank,
                     kinds[k].source);
            return -1;
        }
        if (rank >= world) {
            snprintf(err, err_len, "%s=%d is not below %s=%d: ranks count from 0 to world size - 1", kinds[k].rank,
                     rank, kinds[k].world, world);
            return -1;
        }
        if (launcher_env_int(kinds[k].local, 0, 1 << 20, &local, err, err_len) < 0) return -1;
        info->rank = rank, info->world = world, info->local_rank = local, info->source = kinds[k].source;
        break;
    }
    const char* addr = getenv("MASTER_ADDR");
    snprintf(info->master_addr, sizeof(info->master_addr), "%s", addr && *addr ? addr : "127.0.0.1");
    info->master_port = LAUNCH_DEFAULT_PORT;
    if (launcher_env_int("MASTER_PORT", 1, 65535, &info->master_port, err, err_len) < 0) return -1;
    return 0;
}

// ---- the TCP exchange -----------------------------------------------------------------------------

static inline void launcher_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static inline double launcher_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Sends or receives exactly n bytes before `deadline`; 0, or -1 (timeout, closed or error).
static inline int launcher_io(int fd, void* buf, size_t n, int sending, double deadline) {
    char* p = (char*)buf;
    while (n > 0) {
        double left = deadline - launcher_now();
        if (left <= 0) return -1;
        struct pollfd pfd = {fd, (short)(sending ? POLLOUT : POLLIN), 0};
        int r = poll(&pfd, 1, (int)(left * 1000) + 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        ssize_t k = sending ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

typedef struct { uint32_t magic, version; int32_t rank, world; uint64_t tag; } LaunchHello;
typedef struct { uint32_t magic; int32_t status, world, detail; } LaunchReply;

static inline void launcher_reply(int fd, int status, int world, int detail, const void* payload, size_t bytes,
                                  double deadline) {
    LaunchReply r = {LAUNCH_MAGIC, status, world, detail};
    unsigned char buf[sizeof(LaunchReply) + LAUNCH_MAX_PAYLOAD];
    memset(buf, 0, sizeof(buf));
    memcpy(buf, &r, sizeof(r));
    if (status == LAUNCH_OK) memcpy(buf + sizeof(r), payload, bytes);
    launcher_io(fd, buf, sizeof(r) + bytes, 1, deadline);
}

// Rank 0's listening socket on MASTER_PORT (all interfaces), or -1 with the reason in err.
static inline int launcher_listen(const LaunchInfo* info, char* err, size_t err_len) {
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    if (listener < 0) {
        snprintf(err, err_len, "rendezvous: cannot create a socket: %s", strerror(errno));
        return -1;
    }
    int one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    sa.sin_port = htons((uint16_t)info->master_port);
    if (bind(listener, (struct sockaddr*)&sa, sizeof(sa)) != 0 || listen(listener, info->world + 16) != 0) {
        snprintf(err, err_len, "rendezvous: rank 0 cannot listen on port %d: %s; set MASTER_PORT to a free port "
                 "(the same for every rank), or end the earlier run that still holds it", info->master_port,
                 strerror(errno));
        close(listener);
        return -1;
    }
    return listener;
}

// Rank 0: waits (until `deadline`) for the next connection that says a hello of ours into *h; its
// socket, or -1 at the deadline. Connections that are not one of ours are closed and skipped.
static inline int launcher_next_hello(int listener, double deadline, LaunchHello* h) {
    for (;;) {
        double left = deadline - launcher_now();
        struct pollfd pfd = {listener, POLLIN, 0};
        int r = left > 0 ? poll(&pfd, 1, (int)(left * 1000) + 1) : 0;
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        int fd = accept(listener, NULL, NULL);
        if (fd < 0) continue;
        if (launcher_io(fd, h, sizeof(*h), 0, launcher_now() + 10.0) != 0 || h->magic != LAUNCH_MAGIC ||
            h->version != LAUNCH_VERSION) {
            close(fd);  // not one of ours (a port scanner, another program): ignore it
            continue;
        }
        return fd;
    }
}

// Rank 0: checks one hello against its world size and tag. LAUNCH_OK (the rank is marked in `seen`),
// or the error, with the reason in err, told to that rank (on fd) at once.
static inline int launcher_check_hello(const LaunchHello* h, int fd, int W, uint64_t tag, size_t bytes, int* seen,
                                       char* err, size_t err_len) {
    int status;
    if (h->world != W) {
        status = LAUNCH_WORLD_MISMATCH;
        snprintf(err, err_len, "rendezvous: rank %d says world size %d, rank 0 says %d: start every process "
                 "with the same -np / WORLD_SIZE / --ntasks", h->rank, h->world, W);
    } else if (h->rank <= 0 || h->rank >= W || seen[h->rank]) {
        status = h->rank == 0 || (h->rank > 0 && h->rank < W) ? LAUNCH_DUPLICATE_RANK : LAUNCH_BAD_RANK;
        snprintf(err, err_len, "rendezvous: two processes say they are rank %d (of %d): give every process its "
                 "own RANK, or check that two runs do not share MASTER_PORT", h->rank, W);
    } else if (h->tag != tag) {
        status = LAUNCH_TAG_MISMATCH;
        snprintf(err, err_len, "rendezvous: rank %d was started with other options than rank 0 (model, batch, "
                 "--zero, data or steps differ): start every rank with the same command line", h->rank);
    } else {
        seen[h->rank] = 1;
        return LAUNCH_OK;
    }
    launcher_reply(fd, status, W, h->rank, NULL, bytes, launcher_now() + 5.0);
    return status;
}

// Rank 0's reason when not every rank arrived in time: how many did, and which are missing (the first 8).
static inline void launcher_serve_timeout_message(const LaunchInfo* info, int arrived, const int* seen,
                                                  double timeout_s, char* err, size_t err_len) {
    const int W = info->world;
    int n = snprintf(err, err_len, "rendezvous: only %d of %d ranks reached rank 0 on port %d within %g s; "
                     "missing ranks:", arrived + 1, W, info->master_port, timeout_s);
    for (int r = 1, shown = 0; r < W && n > 0 && (size_t)n < err_len; r++)
        if (!seen[r] && shown++ < 8) n += snprintf(err + n, err_len - (size_t)n, " %d", r);
    if (n > 0 && (size_t)n < err_len)
        snprintf(err + n, err_len - (size_t)n, "; check that all %d processes were started (-np / WORLD_SIZE) "
                 "and that they reach MASTER_ADDR:MASTER_PORT (or raise --rendezvous-timeout)", W);
}

// Rank 0: collects world − 1 hellos, checks them, sends the payload (or the error) to everyone.
static inline int launcher_serve(const LaunchInfo* info, uint64_t tag, const void* payload, size_t bytes,
                                 double timeout_s, int* keep, char* err, size_t err_len) {
    const int W = info->world;
    int listener = launcher_listen(info, err, err_len);
    if (listener < 0) return -1;
    int* fds = (int*)malloc(sizeof(int) * (size_t)W);
    int* ranks = (int*)malloc(sizeof(int) * (size_t)W);
    int* seen = (int*)calloc((size_t)W, sizeof(int));
    int arrived = 0, status = LAUNCH_OK, detail = 0;
    const double deadline = launcher_now() + timeout_s;
    while (arrived < W - 1 && status == LAUNCH_OK) {
        LaunchHello h;
        int fd = launcher_next_hello(listener, deadline, &h);
        if (fd < 0) {
            status = LAUNCH_TIMEOUT;
            break;
        }
        ranks[arrived] = h.rank;
        fds[arrived++] = fd;
        status = launcher_check_hello(&h, fd, W, tag, bytes, seen, err, err_len);
        if (status != LAUNCH_OK) detail = h.rank;
    }
    if (status == LAUNCH_TIMEOUT) {
        detail = arrived + 1;
        launcher_serve_timeout_message(info, arrived, seen, timeout_s, err, err_len);
    }
    for (int i = 0; i < arrived; i++) {
        launcher_reply(fds[i], status, W, detail, payload, bytes, launcher_now() + 5.0);
        if (keep && status == LAUNCH_OK) keep[ranks[i]] = fds[i];  // the heartbeat's socket to that rank
        else close(fds[i]);
    }
    free(fds);
    free(ranks);
    free(seen);
    close(listener);
    return status == LAUNCH_OK ? 0 : -1;
}

// Other ranks: connects to MASTER_ADDR:MASTER_PORT, retrying until timeout_s has passed. The socket, or
// -1 with the reason (and the last error seen) in err.
static inline int launcher_connect(const LaunchInfo* info, double timeout_s, char* err, size_t err_len) {
    char port[16];
    snprintf(port, sizeof(port), "%d", info->master_port);
    const double deadline = launcher_now() + timeout_s;
    int fd = -1;
    const char* last = "no answer";
    char last_buf[256];
    while (fd < 0) {
        struct addrinfo hints, *res = NULL;
        memset(&hints, 0, sizeof(hints));
        hints.ai_family = AF_INET;
        hints.ai_socktype = SOCK_STREAM;
        int gai = getaddrinfo(info->master_addr, port, &hints, &res);
        if (gai == 0) {
            for (struct addrinfo* a = res; a && fd < 0; a = a->ai_next) {
                int s = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
                if (s < 0) continue;
                if (connect(s, a->ai_addr, a->ai_addrlen) == 0) {
                    fd = s;
                } else {
                    snprintf(last_buf, sizeof(last_buf), "%s", strerror(errno));
                    last = last_buf;
                    close(s);
                }
            }
            freeaddrinfo(res);
        } else {
            snprintf(last_buf, sizeof(last_buf), "cannot resolve the host: %s", gai_strerror(gai));
            last = last_buf;
        }
        if (fd >= 0) break;
        if (launcher_now() + 0.1 >= deadline) {
            snprintf(err, err_len, "rendezvous: rank %d could not reach rank 0 at %s:%d within %g s (%s); check that "
                     "rank 0 was started, that MASTER_ADDR is rank 0's host and MASTER_PORT is the same for every "
                     "rank and open, or raise --rendezvous-timeout", info->rank, info->master_addr, info->master_port,
                     timeout_s, last);
            return -1;
        }
        launcher_sleep_ms(100);
    }
    return fd;
}

// Other ranks: the reason rank 0 gave (reply r, status not LAUNCH_OK), into err.
static inline void launcher_join_reason(const LaunchInfo* info, const LaunchReply* r, char* err, size_t err_len) {
    switch (r->status) {
        case LAUNCH_WORLD_MISMATCH:
            if (r->detail == info->rank)
                snprintf(err, err_len, "rendezvous: rank %d says world size %d, rank 0 says %d: start every process "
                         "with the same -np / WORLD_SIZE / --ntasks", info->rank, info->world, r->world);
            else
                snprintf(err, err_len, "rendezvous: rank %d disagrees on the world size (rank 0 says %d, this rank "
                         "%d), so rank 0 stopped the run: start every process with the same -np / WORLD_SIZE / "
                         "--ntasks", r->detail, r->world, info->world);
            break;
        case LAUNCH_DUPLICATE_RANK:
        case LAUNCH_BAD_RANK:
            snprintf(err, err_len, "rendezvous: two processes say they are rank %d (of %d), so rank 0 stopped the run: "
                     "give every process its own RANK, or check that two runs do not share MASTER_PORT", r->detail,
                     r->world);
            break;
        case LAUNCH_TAG_MISMATCH:
            snprintf(err, err_len, "rendezvous: rank %d was started with other options than rank 0 (model, batch, "
                     "--zero, data or steps differ), so rank 0 stopped the run: start every rank with the same "
                     "command line", r->detail);
            break;
        case LAUNCH_TIMEOUT:
            snprintf(err, err_len, "rendezvous: rank 0 gave up waiting: only %d of %d ranks arrived in time; check "
                     "that all %d processes were started (-np / WORLD_SIZE) and reach MASTER_ADDR:MASTER_PORT",
                     r->detail, r->world, r->world);
            break;
        default: snprintf(err, err_len, "rendezvous: rank 0 refused rank %d (status %d)", info->rank, (int)r->status);
    }
}

// Other ranks: connect (retrying), say hello, read the payload or rank 0's reason.
static inline int launcher_join(const LaunchInfo* info, uint64_t tag, void* payload, size_t bytes, double timeout_s,
                                int* keep, char* err, size_t err_len) {
    int fd = launcher_connect(info, timeout_s, err, err_len);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    LaunchHello h = {LAUNCH_MAGIC, LAUNCH_VERSION, info->rank, info->world, tag};
    unsigned char buf[sizeof(LaunchReply) + LAUNCH_MAX_PAYLOAD];
    LaunchReply r;
    // Rank 0 answers once everyone has arrived, at the latest at its own deadline: wait a little longer.
    const double reply_deadline = launcher_now() + timeout_s + 10.0;
    if (launcher_io(fd, &h, sizeof(h), 1, reply_deadline) != 0 ||
        launcher_io(fd, buf, sizeof(LaunchReply) + bytes, 0, reply_deadline) != 0) {
        close(fd);
        snprintf(err, err_len, "rendezvous: rank %d reached %s:%d but got no answer from rank 0 within %g s; is "
                 "another program (or another run) listening on MASTER_PORT? Check that every rank uses the same "
                 "MASTER_ADDR:MASTER_PORT and world size", info->rank, info->master_addr, info->master_port,
                 timeout_s + 10.0);
        return -1;
    }
    memcpy(&r, buf, sizeof(r));
    if (keep && r.magic == LAUNCH_MAGIC && r.status == LAUNCH_OK) keep[0] = fd;  // the heartbeat's socket
    else close(fd);
    if (r.magic != LAUNCH_MAGIC) {
        snprintf(err, err_len, "rendezvous: rank %d got a foreign answer at %s:%d: another program listens on "
                 "MASTER_PORT; choose another port", info->rank, info->master_addr, info->master_port);
        return -1;
    }
    if (r.status == LAUNCH_OK) {
        memcpy(payload, buf + sizeof(r), bytes);
        return 0;
    }
    launcher_join_reason(info, &r, err, err_len);
    return -1;
}

// ---- the file exchange (--rendezvous file:PATH) -------------------------------------------------
//
// For clusters whose nodes cannot open ports to each other but share a filesystem. Files:
//   PATH.rank<r>  rank r's check-in (r >= 1): magic, version, rank, world, tag and a fresh random nonce
//   PATH          rank 0's answer: magic, version, status, world, detail, tag, nonces[world], payload
// Each is written to a temporary name and renamed, so a reader never sees half a file.
// Rank 0 first deletes PATH and every PATH.rank<r> (whatever an older run left), then collects a
// check-in from every rank, checks world and tag, and writes PATH with every rank's nonce. A rank
// accepts PATH only when it holds its own nonce at its own index: a file left by an older run (or
// written for another one) can never carry a nonce this process has just drawn, so it is ignored
// whatever its age or the clocks of the nodes. A rank whose check-in disappears (rank 0 started
// after it and cleaned up) writes it again. On success each rank removes its check-in; PATH stays
// until the next run's rank 0 removes it (harmless: no later nonce matches it).

#define LAUNCH_FILE_MAGIC 0x46545047u  // "GPTF"
#define LAUNCH_FILE_POLL_MS 50

typedef struct { uint32_t magic, version; int32_t rank, world; uint64_t tag, nonce; } LaunchCheckIn;
typedef struct { uint32_t magic, version; int32_t status, world, detail, unused; uint64_t tag; } LaunchAnswer;

// Writes `n` bytes to `path` atomically (a temporary name beside it, then rename). 0 or -1 (errno).
static inline int launcher_write_atomic(const char* path, const void* data, size_t n) {
    char tmp[4400];  // path (< 4200, see launcher_rendezvous_keep) + the suffix
    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld.%lx", path, (long)getpid(), (unsigned long)(launcher_now() * 1e6));
    FILE* f = fopen(tmp, "wb");
    if (!f) return -1;
    const int ok = fwrite(data, 1, n, f) == n;
    if (fclose(f) != 0 || !ok || rename(tmp, path) != 0) {
        const int e = errno;
        unlink(tmp);
        errno = e;
        return -1;
    }
    return 0;
}

// Reads up to `max` bytes of `path` into a malloc'd buffer (*n: how many); NULL when it is absent.
static inline unsigned char* launcher_read_file(const char* path, size_t max, size_t* n) {
    FILE* f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char* buf = (unsigned char*)malloc(max ? max : 1);
    *n = buf ? fread(buf, 1, max, f) : 0;
    fclose(f);
    return buf;
}

static inline uint64_t launcher_nonce(void) {
    uint64_t v = 0;
    FILE* f = fopen("/dev/urandom", "rb");
    if (f) {
        if (fread(&v, sizeof(v), 1, f) != 1) v = 0;
        fclose(f);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);  // without /dev/urandom: time and pid, still fresh per process
    v ^= ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40);
    return v ? v : 1;  // 0 means "no nonce" in rank 0's answer
}

static inline void launcher_checkin_path(char* out, size_t len, const char* path, int rank) {
    snprintf(out, len, "%s.rank%d", path, rank);
}

// Rank 0 writes its answer (nonces of the ranks it heard from; payload only when status is OK).
static inline int launcher_file_answer(const char* path, int status, int world, int detail, uint64_t tag,
                                       const uint64_t* nonces, const void* payload, size_t bytes) {
    const size_t n = sizeof(LaunchAnswer) + sizeof(uint64_t) * (size_t)world + bytes;
    unsigned char* buf = (unsigned char*)calloc(1, n);
    if (!buf) return -1;
    LaunchAnswer a = {LAUNCH_FILE_MAGIC, LAUNCH_VERSION, status, world, detail, 0, tag};
    memcpy(buf, &a, sizeof(a));
    memcpy(buf + sizeof(a), nonces, sizeof(uint64_t) * (size_t)world);
    if (status == LAUNCH_OK) memcpy(buf + sizeof(a) + sizeof(uint64_t) * (size_t)world, payload, bytes);
    const int rc = launcher_write_atomic(path, buf, n);
    free(buf);
    return rc;
}

// Rank 0's side of the file exchange.
static inline int launcher_file_serve(const LaunchInfo* info, const char* path, uint64_t tag, const void* payload,
                                      size_t bytes, double timeout_s, char* err, size_t err_len) {
    const int W = info->world;
    char name[4200];
    unlink(path);  // an older run's leftovers: never read
    for (int r = 1; r < W; r++) launcher_checkin_path(name, sizeof(name), path, r), unlink(name);
    uint64_t* nonces = (uint64_t*)calloc((size_t)W, sizeof(uint64_t));
    int arrived = 1, status = LAUNCH_OK, detail = 0;
    const double deadline = launcher_now() + timeout_s;
    while (arrived < W && status == LAUNCH_OK) {
        for (int r = 1; r < W && status == LAUNCH_OK; r++) {
            if (nonces[r]) continue;
            launcher_checkin_path(name, sizeof(name), path, r);
            size_t n = 0;
            unsigned char* buf = launcher_read_file(name, sizeof(LaunchCheckIn), &n);
            LaunchCheckIn c;
            if (!buf || n != sizeof(c)) {
                free(buf);
                continue;
            }
            memcpy(&c, buf, sizeof(c));
            free(buf);
            if (c.magic != LAUNCH_FILE_MAGIC || c.version != LAUNCH_VERSION || c.rank != r || !c.nonce) continue;
            nonces[r] = c.nonce, arrived++;
            if (c.world != W) {
                status = LAUNCH_WORLD_MISMATCH, detail = r;
                snprintf(err, err_len, "rendezvous: rank %d says world size %d, rank 0 says %d: start every process "
                         "with the same -np / WORLD_SIZE / --ntasks", r, c.world, W);
            } else if (c.tag != tag) {
                status = LAUNCH_TAG_MISMATCH, detail = r;
                snprintf(err, err_len, "rendezvous: rank %d was started with other options than rank 0 (model, "
                         "batch, --zero, data or steps differ): start every rank with the same command line", r);
            }
        }
        if (arrived < W && status == LAUNCH_OK) {
            if (launcher_now() >= deadline) {
                status = LAUNCH_TIMEOUT, detail = arrived;
                break;
            }
            launcher_sleep_ms(LAUNCH_FILE_POLL_MS);
        }
    }
    if (status == LAUNCH_TIMEOUT) {
        int n = snprintf(err, err_len, "rendezvous: only %d of %d ranks checked in at %.500s within %g s; missing ranks:",
                         arrived, W, path, timeout_s);
        for (int r = 1, shown = 0; r < W && n > 0 && (size_t)n < err_len; r++)
            if (!nonces[r] && shown++ < 8) n += snprintf(err + n, err_len - (size_t)n, " %d", r);
        if (n > 0 && (size_t)n < err_len)
            snprintf(err + n, err_len - (size_t)n, "; check that all %d processes were started with the same "
                     "--rendezvous file:PATH on a filesystem every node shares (or raise --rendezvous-timeout)", W);
    }
    const int wrote = launcher_file_answer(path, status, W, detail, tag, nonces, payload, bytes);
    free(nonces);
    if (wrote != 0 && status == LAUNCH_OK) {
        snprintf(err, err_len, "rendezvous: rank 0 cannot write %.500s: %s; --rendezvous file:PATH needs a directory "
                 "every rank can write", path, strerror(errno));
        return -1;
    }
    return status == LAUNCH_OK ? 0 : -1;
}

// Reads rank 0's answer; 1 when it is meant for this process (its nonce at its index), else 0.
static inline int launcher_file_answer_for_me(const char* path, const LaunchInfo* info, uint64_t nonce,
                                              LaunchAnswer* a, void* payload, size_t bytes) {
    const size_t want = sizeof(LaunchAnswer) + sizeof(uint64_t) * (size_t)info->world + bytes;
    size_t n = 0;
    unsigned char* buf = launcher_read_file(path, want, &n);
    if (!buf) return 0;
    int mine = 0;
    if (n >= sizeof(LaunchAnswer)) {
        memcpy(a, buf, sizeof(*a));
        const size_t need = sizeof(LaunchAnswer) + sizeof(uint64_t) * (size_t)(a->world > 0 ? a->world : 0);
        uint64_t theirs = 0;
        if (a->magic == LAUNCH_FILE_MAGIC && a->world > info->rank && n >= need) {
            memcpy(&theirs, buf + sizeof(LaunchAnswer) + sizeof(uint64_t) * (size_t)info->rank, sizeof(theirs));
            mine = theirs == nonce;
        }
        if (mine && a->status == LAUNCH_OK) {
            if (a->world != info->world || n != want) mine = 0;  // cannot be: rank 0 checked the world
            else memcpy(payload, buf + need, bytes);
        }
    }
    free(buf);
    return mine;
}

// The other ranks' side: check in, then wait for rank 0's answer carrying this process's nonce.
static inline int launcher_file_join(const LaunchInfo* info, const char* path, uint64_t tag, void* payload,
                                     size_t bytes, double timeout_s, char* err, size_t err_len) {
    char mine[4200];
    launcher_checkin_path(mine, sizeof(mine), path, info->rank);
    LaunchCheckIn c = {LAUNCH_FILE_MAGIC, LAUNCH_VERSION, info->rank, info->world, tag, launcher_nonce()};
    const double deadline = launcher_now() + timeout_s;
    for (;;) {
        LaunchAnswer a;
        if (launcher_file_answer_for_me(path, info, c.nonce, &a, payload, bytes)) {
            unlink(mine);
            switch (a.status) {
                case LAUNCH_OK: return 0;
                case LAUNCH_WORLD_MISMATCH:
                    snprintf(err, err_len, "rendezvous: rank %d disagrees on the world size (rank 0 says %d, this rank "
                             "%d), so rank 0 stopped the run: start every process with the same -np / WORLD_SIZE / "
                             "--ntasks", a.detail, a.world, info->world);
                    return -1;
                case LAUNCH_TAG_MISMATCH:
                    snprintf(err, err_len, "rendezvous: rank %d was started with other options than rank 0 (model, "
                             "batch, --zero, data or steps differ), so rank 0 stopped the run: start every rank with "
                             "the same command line", a.detail);
                    return -1;
                case LAUNCH_TIMEOUT:
                    snprintf(err, err_len, "rendezvous: rank 0 gave up waiting: only %d of %d ranks checked in at %.500s "
                             "in time; check that all %d processes were started with the same --rendezvous", a.detail,
                             a.world, path, a.world);
                    return -1;
                default:
                    snprintf(err, err_len, "rendezvous: rank 0 refused rank %d (status %d)", info->rank, (int)a.status);
                    return -1;
            }
        }
        if (access(mine, F_OK) != 0 && launcher_write_atomic(mine, &c, sizeof(c)) != 0) {  // (again: rank 0 cleaned up)
            snprintf(err, err_len, "rendezvous: rank %d cannot write %.500s: %s; --rendezvous file:PATH needs a "
                     "directory every rank can write", info->rank, mine, strerror(errno));
            return -1;
        }
        if (launcher_now() >= deadline) {
            unlink(mine);
            snprintf(err, err_len, "rendezvous: rank %d got no answer from rank 0 at %.500s within %g s; check that rank 0 "
                     "was started with the same --rendezvous file:PATH, that the path is on a filesystem every node "
                     "shares, that every rank has the same world size and no other process claims rank %d (or "
                     "raise --rendezvous-timeout)", info->rank, path, timeout_s, info->rank);
            return -1;
        }
        launcher_sleep_ms(LAUNCH_FILE_POLL_MS);
    }
}

// ---- the entry points ------------------------------------------------------------------------------

// --rendezvous: "tcp" (or NULL/""): MASTER_ADDR:MASTER_PORT; "file:PATH": the file exchange, *path =
// PATH. 0 (tcp), 1 (file) or -1 with the reason in err.
static inline int launcher_parse_method(const char* text, const char** path, char* err, size_t err_len) {
    *path = NULL;
    if (!text || !*text || strcmp(text, "tcp") == 0) return 0;
    if (strncmp(text, "file:", 5) == 0 && text[5]) {
        *path = text + 5;
        return 1;
    }
    snprintf(err, err_len, "--rendezvous expects tcp or file:PATH (a path on a filesystem every rank shares), got "
             "\"%s\"", text);
    return -1;
}

// Rank 0 sends `payload` (bytes <= LAUNCH_MAX_PAYLOAD) to every other rank, which receive it into
// `payload`, over TCP (file_path NULL) or through files at file_path. All ranks must agree on world
// and tag. keep (TCP only; NULL: close them): world sockets, -1 preset by the caller; rank 0's
// keep[r] becomes its connection to rank r, another rank's keep[0] its connection to rank 0 (the
// heartbeat, layers/multi_gpu/heartbeat.h). 0, or -1 with the reason in err (see the top).
static inline int launcher_rendezvous_keep(const LaunchInfo* info, const char* file_path, uint64_t tag, void* payload,
                                           size_t bytes, double timeout_s, int* keep, char* err, size_t err_len) {
    if (bytes > LAUNCH_MAX_PAYLOAD) {
        snprintf(err, err_len, "rendezvous: payload of %zu bytes is too large (a bug)", bytes);
        return -1;
    }
    if (info->world <= 1) return 0;
    if (file_path && strlen(file_path) > 4000) {
        snprintf(err, err_len, "rendezvous: the --rendezvous file path is longer than 4000 characters");
        return -1;
    }
    if (file_path)
        return info->rank == 0 ? launcher_file_serve(info, file_path, tag, payload, bytes, timeout_s, err, err_len)
                               : launcher_file_join(info, file_path, tag, payload, bytes, timeout_s, err, err_len);
    return info->rank == 0 ? launcher_serve(info, tag, payload, bytes, timeout_s, keep, err, err_len)
                           : launcher_join(info, tag, payload, bytes, timeout_s, keep, err, err_len);
}

// FNV-1a over bytes, for the rendezvous tag (the options every rank must share).
static inline uint64_t launcher_hash(uint64_t h, const void* data, size_t n) {
    const unsigned char* p = (const unsigned char*)data;
    if (h == 0) h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

#endif  // LAUNCHER_H
