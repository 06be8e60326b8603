// test_launcher.c: tests of layers/multi_gpu/launcher.h on the CPU: the launcher environments (torchrun,
// mpirun, srun, none, and bad values at the bounds of each variable), and the TCP rendezvous between processes forked here on
// 127.0.0.1 and a free port: matching ranks all receive rank 0's 128-byte payload; a world-size
// mismatch, a duplicate rank, a hello claiming rank 0 or one outside the world, different options, a
// missing rank and an unreachable rank 0 all fail on every side with the expected message, well within
// the timeout (no hang); the connections kept for the heartbeat are indexed by rank. The same through a
// shared file (--rendezvous file:PATH), and files left by an older run are never taken for this
// run's: a stale answer and stale check-ins are ignored.
#define _POSIX_C_SOURCE 200809L  // setenv, fork, getaddrinfo under -std=c11

#include <signal.h>
#include <sys/wait.h>

#include "layers/multi_gpu/launcher.h"
#include "test/test_harness.h"
#include "test/test_ports.h"

#define PAYLOAD 128
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))
#define ERR_LEN 1024

static const char* const ENV_VARS[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK",
                                       "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_PROCID",
                                       "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_LOCALID", "PMI_RANK", "PMI_SIZE",
                                       "MPI_LOCALRANKID", "MASTER_ADDR", "MASTER_PORT"};

static void clear_env(void) {
    for (size_t i = 0; i < sizeof(ENV_VARS) / sizeof(ENV_VARS[0]); i++) unsetenv(ENV_VARS[i]);
}

static void test_detect(void) {
    LaunchInfo li;
    char err[ERR_LEN] = "";
    clear_env();
    int rc = launcher_detect(&li, err, sizeof(err));
    test_report("detect_none_is_one_process", rc == 0 && li.world == 1 && li.rank == 0 && !strcmp(li.source, "none") &&
                    !strcmp(li.master_addr, "127.0.0.1") && li.master_port == 29500,
                "rc %d world %d rank %d source %s addr %s port %d", rc, li.world, li.rank, li.source, li.master_addr,
                li.master_port);

    setenv("RANK", "1", 1), setenv("WORLD_SIZE", "4", 1), setenv("LOCAL_RANK", "1", 1);
    setenv("MASTER_ADDR", "node7", 1), setenv("MASTER_PORT", "1234", 1);
    setenv("OMPI_COMM_WORLD_RANK", "3", 1), setenv("OMPI_COMM_WORLD_SIZE", "8", 1);  // torchrun vars win
    rc = launcher_detect(&li, err, sizeof(err));
    test_report("detect_torchrun_env", rc == 0 && li.rank == 1 && li.world == 4 && li.local_rank == 1 &&
                    !strcmp(li.source, "torchrun env") && !strcmp(li.master_addr, "node7") && li.master_port == 1234,
                "rc %d rank %d world %d local %d source %s (%s)", rc, li.rank, li.world, li.local_rank, li.source, err);

    clear_env();
    setenv("OMPI_COMM_WORLD_RANK", "3", 1), setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1);
    rc = launcher_detect(&li, err, sizeof(err));
    test_report("detect_mpirun", rc == 0 && li.rank == 3 && li.world == 8 && li.local_rank == 3 &&
                    !strcmp(li.source, "mpirun"), "rc %d rank %d world %d source %s (%s)", rc, li.rank, li.world,
                li.source, err);

    clear_env();
    setenv("SLURM_PROCID", "5", 1), setenv("SLURM_NTASKS", "16", 1), setenv("SLURM_STEP_NUM_TASKS", "6", 1);
    setenv("SLURM_LOCALID", "1", 1);
    rc = launcher_detect(&li, err, sizeof(err));
    test_report("detect_srun_prefers_the_step_tasks", rc == 0 && li.rank == 5 && li.world == 6 && li.local_rank == 1 &&
                    !strcmp(li.source, "srun") && li.local_rank == 1, "rc %d rank %d world %d (%s)", rc, li.rank,
                li.world, err);

    clear_env();
    setenv("RANK", "2", 1), setenv("WORLD_SIZE", "2", 1);
    rc = launcher_detect(&li, err, sizeof(err));
    test_report("detect_rank_not_below_world_is_an_error", rc == -1 && strstr(err, "RANK=2 is not below WORLD_SIZE=2"),
                "rc %d err %s", rc, err);
    clear_env();
    setenv("RANK", "0", 1);
    rc = launcher_detect(&li, err, sizeof(err));
    test_report("detect_rank_without_world_is_an_error", rc == -1 && strstr(err, "WORLD_SIZE"), "rc %d err %s", rc, err);
    clear_env();
    setenv("MASTER_PORT", "http", 1);
    rc = launcher_detect(&li, err, sizeof(err));
    test_report("detect_bad_port_is_an_error", rc == -1 && strstr(err, "MASTER_PORT"), "rc %d err %s", rc, err);
    clear_env();
}

// The bounds of what launcher_detect accepts, one case each: env is "NAME=VALUE ..." (after clearing
// every launcher variable); a good one is described as "rank R world W local L port P", and `want`
// is looked for in that or in the error. Each bad value is refused with a message naming it, and
// the value next to it is accepted.
static const struct {
    const char *name, *env;
    int rc;
    const char* want;
} DETECT_BOUNDS[] = {
    {"detect_negative_rank_is_an_error", "RANK=-1 WORLD_SIZE=2", -1, "RANK=\"-1\" is not a whole number in [0, "},
    {"detect_port_0_is_an_error", "MASTER_PORT=0", -1, "MASTER_PORT=\"0\" is not a whole number in [1, 65535]"},
    {"detect_port_above_65535_is_an_error", "MASTER_PORT=65536", -1, "MASTER_PORT=\"65536\""},
    {"detect_port_65535_is_accepted", "MASTER_PORT=65535", 0, "rank 0 world 1 local -1 port 65535"},
    {"detect_port_with_trailing_letters_is_an_error", "MASTER_PORT=29500x", -1, "MASTER_PORT=\"29500x\""},
    {"detect_bad_local_rank_is_an_error", "RANK=0 WORLD_SIZE=2 LOCAL_RANK=gpu0", -1, "LOCAL_RANK=\"gpu0\""},
    {"detect_srun_without_step_tasks_uses_ntasks", "SLURM_PROCID=2 SLURM_NTASKS=4", 0, "rank 2 world 4 local -1"},
    {"detect_world_without_rank_names_the_missing_one", "WORLD_SIZE=2", -1,
     "WORLD_SIZE is set but RANK is not: set both"},
};

static void test_detect_bounds(void) {
    for (size_t i = 0; i < COUNT(DETECT_BOUNDS); i++) {
        clear_env();
        char env[128], got[ERR_LEN + 64] = "", err[ERR_LEN] = "";
        snprintf(env, sizeof(env), "%s", DETECT_BOUNDS[i].env);
        for (char* item = strtok(env, " "); item; item = strtok(NULL, " ")) {
            char* eq = strchr(item, '=');
            *eq = '\0';
            setenv(item, eq + 1, 1);
        }
        LaunchInfo li;
        const int rc = launcher_detect(&li, err, sizeof(err));
        if (rc == 0)
            snprintf(got, sizeof(got), "rank %d world %d local %d port %d", li.rank, li.world, li.local_rank,
                     li.master_port);
        else
            snprintf(got, sizeof(got), "%s", err);
        test_report(DETECT_BOUNDS[i].name, rc == DETECT_BOUNDS[i].rc && strstr(got, DETECT_BOUNDS[i].want),
                    "%s: rc %d (want %d): %s", DETECT_BOUNDS[i].env, rc, DETECT_BOUNDS[i].rc, got);
    }
    clear_env();
}

typedef struct {
    int rank, world;
    uint64_t tag;
    double timeout_s;
} Proc;

// Per-process options of run_procs_flags (a bit set; 0 for the usual rendezvous).
enum {
    AS_CLIENT = 1,  // joins as a client whatever its rank (launcher_join), so its hello can claim rank 0
    KEEP = 2,       // keeps the connections; a client then sends its rank over it, rank 0 reads them
};

typedef struct {
    int rc;
    double seconds;
    char err[ERR_LEN];
    unsigned char payload[PAYLOAD];
    int heard[8];  // keep: what rank 0 read on its kept connection to rank r (-1: nothing)
} Result;

// Rank 0 (keep): reads one int from each kept connection, into heard[r]; the others send their rank.
static void use_kept(const Proc* p, const int* keep, Result* r) {
    for (int i = 0; i < 8; i++) r->heard[i] = -1;
    if (p->rank != 0) {
        int32_t me = p->rank;
        launcher_io(keep[0], &me, sizeof(me), 1, launcher_now() + 10.0);
        return;
    }
    for (int peer = 1; peer < p->world && peer < 8; peer++) {
        int32_t v = -1;
        if (keep[peer] >= 0 && launcher_io(keep[peer], &v, sizeof(v), 0, launcher_now() + 10.0) == 0)
            r->heard[peer] = v;
    }
}

// One process's rendezvous (in a forked child), over TCP on `port` or through files at `file`.
static void run_one(const Proc* p, int flags, int port, const char* file, const unsigned char* offer, Result* r) {
    LaunchInfo li;
    memset(&li, 0, sizeof(li));
    li.rank = p->rank, li.world = p->world, li.local_rank = -1, li.source = "test";
    snprintf(li.master_addr, sizeof(li.master_addr), "127.0.0.1");
    li.master_port = port;
    memset(r, 0, sizeof(*r));
    if (p->rank == 0 && !(flags & AS_CLIENT)) memcpy(r->payload, offer, PAYLOAD);
    int keep[8];
    for (int i = 0; i < 8; i++) keep[i] = -1;
    double t0 = launcher_now();
    if (flags & AS_CLIENT)
        r->rc = launcher_join(&li, p->tag, r->payload, PAYLOAD, p->timeout_s, NULL, r->err, sizeof(r->err));
    else
        r->rc = launcher_rendezvous_keep(&li, file, p->tag, r->payload, PAYLOAD, p->timeout_s,
                                         flags & KEEP ? keep : NULL, r->err, sizeof(r->err));
    r->seconds = launcher_now() - t0;
    if ((flags & KEEP) && r->rc == 0) use_kept(p, keep, r);
}

// Runs one rendezvous per Proc in forked children, over TCP on `port` or (file != NULL) through
// files at `file`, with flags[i] (NULL: none); fills results (rank 0 offers `offer`).
static void run_procs_flags(const Proc* procs, const int* flags, int n, int port, const char* file,
                            const unsigned char* offer, Result* results) {
    pid_t pids[16];
    int pipes[16][2];
    for (int i = 0; i < n; i++) {
        if (pipe(pipes[i]) != 0) exit(1);
        pids[i] = fork();
        if (pids[i] == 0) {
            alarm(60);  // a hang kills the child, and the parent sees it as a failure
            Result r;
            run_one(&procs[i], flags ? flags[i] : 0, port, file, offer, &r);
            if (write(pipes[i][1], &r, sizeof(r)) != (ssize_t)sizeof(r)) _exit(3);
            _exit(0);
        }
        close(pipes[i][1]);
        if (procs[i].rank == 0 && !(flags && (flags[i] & AS_CLIENT)))
            launcher_sleep_ms(50);  // clients may also come first; they retry
    }
    for (int i = 0; i < n; i++) {
        memset(&results[i], 0, sizeof(Result));
        results[i].rc = -99;
        ssize_t got = 0, k;
        while (got < (ssize_t)sizeof(Result) &&
               (k = read(pipes[i][0], (char*)&results[i] + got, sizeof(Result) - (size_t)got)) > 0)
            got += k;
        if (got != (ssize_t)sizeof(Result)) {
            results[i].rc = -99;
            snprintf(results[i].err, ERR_LEN, "child died without a result (hang killed by alarm?)");
        }
        close(pipes[i][0]);
        waitpid(pids[i], NULL, 0);
    }
}

static void run_procs_via(const Proc* procs, int n, int port, const char* file, const unsigned char* offer,
                          Result* results) {
    run_procs_flags(procs, NULL, n, port, file, offer, results);
}

static void run_procs(const Proc* procs, int n, int port, const unsigned char* offer, Result* results) {
    run_procs_via(procs, n, port, NULL, offer, results);
}

static void test_rendezvous_ok(int world, int clients_first) {
    char name[128];
    snprintf(name, sizeof(name), "rendezvous_world_%d_all_ranks_get_the_id%s", world,
             clients_first ? "_clients_started_first" : "");
    unsigned char offer[PAYLOAD];
    TestRng rng = {(uint64_t)time(NULL) ^ (uint64_t)getpid()};
    for (int i = 0; i < PAYLOAD; i++) offer[i] = (unsigned char)test_rng_next(&rng);
    Proc procs[8];
    for (int i = 0; i < world; i++) {
        int rank = clients_first ? world - 1 - i : i;  // rank 0 last: the clients must retry
        procs[i] = (Proc){rank, world, 42, 20.0};
    }
    Result res[8];
    run_procs(procs, world, test_free_port(29555), offer, res);
    int ok = 1;
    char why[ERR_LEN + 64] = "";
    for (int i = 0; i < world && ok; i++) {
        if (res[i].rc != 0) ok = 0, snprintf(why, sizeof(why), "rank %d: %s", procs[i].rank, res[i].err);
        else if (memcmp(res[i].payload, offer, PAYLOAD) != 0)
            ok = 0, snprintf(why, sizeof(why), "rank %d got another payload", procs[i].rank);
    }
    test_report(name, ok, "%s", why);
}

// (world, clients first): rank 0 first, the clients first (they must retry), and a world of one.
static const struct {
    int world, clients_first;
} RENDEZVOUS[] = {{2, 0}, {4, 1}, {1, 0}};

static void test_rendezvous_worlds(void) {
    for (size_t i = 0; i < COUNT(RENDEZVOUS); i++) test_rendezvous_ok(RENDEZVOUS[i].world, RENDEZVOUS[i].clients_first);
}

static int contains(const Result* r, const char* word) { return strstr(r->err, word) != NULL; }

static void test_world_mismatch(void) {
    Proc procs[2] = {{0, 2, 7, 20.0}, {1, 3, 7, 20.0}};
    Result r[2];
    unsigned char offer[PAYLOAD] = {9};
    run_procs(procs, 2, test_free_port(29555), offer, r);
    const char* want = "rank 1 says world size 3, rank 0 says 2";
    test_report("rendezvous_world_size_mismatch_fails_on_both_sides_at_once",
                r[0].rc == -1 && r[1].rc == -1 && contains(&r[0], want) && contains(&r[1], want) &&
                    contains(&r[0], "WORLD_SIZE") && r[0].seconds < 10 && r[1].seconds < 10,
                "rank 0 (%d, %.1f s): %s | rank 1 (%d, %.1f s): %s", r[0].rc, r[0].seconds, r[0].err, r[1].rc,
                r[1].seconds, r[1].err);
}

static void test_duplicate_rank_and_tag(void) {
    unsigned char offer[PAYLOAD] = {1};
    Proc dup[3] = {{0, 3, 7, 20.0}, {1, 3, 7, 20.0}, {1, 3, 7, 20.0}};
    Result r[3];
    run_procs(dup, 3, test_free_port(29555), offer, r);
    test_report("rendezvous_duplicate_rank_fails_everywhere",
                r[0].rc == -1 && r[1].rc == -1 && r[2].rc == -1 && contains(&r[0], "two processes say they are rank 1") &&
                    contains(&r[1], "rank 1") && contains(&r[2], "rank 1"),
                "%s | %s | %s", r[0].err, r[1].err, r[2].err);
    Proc tag[2] = {{0, 2, 7, 20.0}, {1, 2, 8, 20.0}};
    run_procs(tag, 2, test_free_port(29555), offer, r);
    test_report("rendezvous_different_options_fail_on_both_sides",
                r[0].rc == -1 && r[1].rc == -1 && contains(&r[0], "other options") && contains(&r[1], "other options"),
                "%s | %s", r[0].err, r[1].err);
}

// A hello that claims rank 0 (rank 0 is the one listening) or a rank outside the world is refused on
// both sides, at once: it must never be counted as a rank (nor index rank 0's table out of bounds).
static void test_bad_hello_rank(void) {
    unsigned char offer[PAYLOAD] = {1};
    Proc zero[2] = {{0, 2, 7, 20.0}, {0, 2, 7, 20.0}};
    const int flags[2] = {0, AS_CLIENT};
    Result r[2];
    run_procs_flags(zero, flags, 2, test_free_port(29555), NULL, offer, r);
    int ok = r[0].rc == -1 && r[1].rc == -1 && contains(&r[0], "rank 0") && r[0].seconds < 10;
    char why[2 * ERR_LEN + 64];
    snprintf(why, sizeof(why), "claims 0: %s | %s", r[0].err, r[1].err);
    Proc outside[2] = {{0, 2, 7, 20.0}, {2, 2, 7, 20.0}};
    run_procs(outside, 2, test_free_port(29555), offer, r);
    if (ok)
        ok = r[0].rc == -1 && r[1].rc == -1 && contains(&r[0], "rank 2 (of 2)") && r[0].seconds < 10,
        snprintf(why, sizeof(why), "claims 2 of 2: %s | %s", r[0].err, r[1].err);
    test_report("rendezvous_hello_claiming_rank_0_or_one_outside_the_world_is_refused", ok, "%s", why);
}

// The kept connections (the watchdog's heartbeat) are indexed by rank, not by arrival: ranks 4..1 of
// a world of 5 are started in that order, and rank 0's keep[r] must reach rank r.
static void test_keep_by_rank(void) {
    unsigned char offer[PAYLOAD] = {2};
    Proc procs[5] = {{0, 5, 7, 20.0}};
    for (int i = 1; i < 5; i++) procs[i] = (Proc){5 - i, 5, 7, 20.0};
    const int flags[5] = {KEEP, KEEP, KEEP, KEEP, KEEP};
    Result r[5];
    run_procs_flags(procs, flags, 5, test_free_port(29555), NULL, offer, r);
    int ok = 1;
    char why[ERR_LEN + 64] = "";
    for (int i = 0; i < 5 && ok; i++)
        if (r[i].rc != 0) ok = 0, snprintf(why, sizeof(why), "rank %d: %s", procs[i].rank, r[i].err);
    for (int peer = 1; peer < 5 && ok; peer++)
        if (r[0].heard[peer] != peer)
            ok = 0, snprintf(why, sizeof(why), "keep[%d] reaches rank %d", peer, r[0].heard[peer]);
    test_report("rendezvous_kept_connections_are_indexed_by_rank", ok, "%s", why);
}

static void test_timeouts(void) {
    unsigned char offer[PAYLOAD] = {1};
    const int port = test_free_port(29555);
    Proc lone[1] = {{1, 2, 7, 1.0}};
    Result r[3];
    run_procs(lone, 1, port, offer, r);
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
    test_report("rendezvous_unreachable_rank_0_times_out_with_the_address",
                r[0].rc == -1 && contains(&r[0], "could not reach rank 0") && contains(&r[0], addr) &&
                    contains(&r[0], "MASTER_ADDR") && r[0].seconds < 5,
                "rc %d after %.1f s: %s", r[0].rc, r[0].seconds, r[0].err);
    Proc missing[2] = {{0, 3, 7, 1.0}, {1, 3, 7, 1.0}};
    run_procs(missing, 2, test_free_port(29555), offer, r);
    test_report("rendezvous_missing_rank_times_out_on_every_side",
                r[0].rc == -1 && r[1].rc == -1 && contains(&r[0], "only 2 of 3 ranks") &&
                    contains(&r[0], "missing ranks: 2") && contains(&r[1], "only 2 of 3 ranks arrived") &&
                    r[0].seconds < 5 && r[1].seconds < 5,
                "rank 0 (%.1f s): %s | rank 1 (%.1f s): %s", r[0].seconds, r[0].err, r[1].seconds, r[1].err);
}

// ---- the file exchange ----------------------------------------------------------------------------

static char g_dir[256];

static void file_path(char* out, size_t len, const char* name) { snprintf(out, len, "%s/%s", g_dir, name); }

static void random_offer(unsigned char* offer) {
    TestRng rng = {(uint64_t)time(NULL) ^ ((uint64_t)getpid() << 16) ^ (uint64_t)clock()};
    for (int i = 0; i < PAYLOAD; i++) offer[i] = (unsigned char)test_rng_next(&rng);
}

static int all_got(const Result* r, int n, const unsigned char* offer, char* why, size_t len) {
    for (int i = 0; i < n; i++) {
        if (r[i].rc != 0) return snprintf(why, len, "proc %d: rc %d: %s", i, r[i].rc, r[i].err), 0;
        if (memcmp(r[i].payload, offer, PAYLOAD) != 0) return snprintf(why, len, "proc %d got another payload", i), 0;
    }
    return 1;
}

static void test_file_ok(void) {
    char path[512], why[ERR_LEN + 64] = "";
    unsigned char offer[PAYLOAD];
    Result r[4];
    file_path(path, sizeof(path), "rdzv_ok");
    random_offer(offer);
    Proc first[4] = {{0, 4, 5, 20.0}, {1, 4, 5, 20.0}, {2, 4, 5, 20.0}, {3, 4, 5, 20.0}};
    run_procs_via(first, 4, 0, path, offer, r);
    int ok = all_got(r, 4, offer, why, sizeof(why));
    char leftover[600];
    snprintf(leftover, sizeof(leftover), "%s.rank1", path);
    test_report("file_rendezvous_world_4_all_ranks_get_the_id", ok && access(leftover, F_OK) != 0, "%s%s", why,
                access(leftover, F_OK) == 0 ? " (rank 1's check-in was left behind)" : "");
    // the same path again, others first: the previous run's answer is still there and must not be taken
    random_offer(offer);
    Proc later[3] = {{2, 3, 5, 20.0}, {1, 3, 5, 20.0}, {0, 3, 5, 20.0}};
    run_procs_via(later, 3, 0, path, offer, r);
    ok = all_got(r, 3, offer, why, sizeof(why));
    test_report("file_rendezvous_rerun_on_the_same_path_clients_first_gets_the_new_id", ok, "%s", why);
}

static void test_file_stale(void) {
    char path[512], name[600];
    unsigned char offer[PAYLOAD], stale[PAYLOAD];
    Result r[2];
    file_path(path, sizeof(path), "rdzv_stale");
    random_offer(stale);
    Proc old[2] = {{0, 2, 5, 20.0}, {1, 2, 5, 20.0}};  // an older run, same world and options
    run_procs_via(old, 2, 0, path, stale, r);
    int ok_old = r[0].rc == 0 && r[1].rc == 0;
    Proc lone[1] = {{1, 2, 5, 1.0}};  // its rank 0 never comes: the old answer must not be taken
    run_procs_via(lone, 1, 0, path, stale, r);
    test_report("file_rendezvous_ignores_an_older_runs_answer", ok_old && r[0].rc == -1 &&
                    contains(&r[0], "got no answer from rank 0") && contains(&r[0], path) && r[0].seconds < 5,
                "old run ok %d; rc %d after %.1f s: %s", ok_old, r[0].rc, r[0].seconds, r[0].err);
    // a check-in left by an older rank 1 (same world and options): rank 0 must not count it
    snprintf(name, sizeof(name), "%s.rank1", path);
    LaunchCheckIn c = {LAUNCH_FILE_MAGIC, LAUNCH_VERSION, 1, 2, 5, 12345};
    launcher_write_atomic(name, &c, sizeof(c));
    random_offer(offer);
    Proc zero[1] = {{0, 2, 5, 1.0}};
    run_procs_via(zero, 1, 0, path, offer, r);
    test_report("file_rendezvous_rank0_ignores_an_older_runs_check_in",
                r[0].rc == -1 && contains(&r[0], "only 1 of 2 ranks checked in") && contains(&r[0], "missing ranks: 1"),
                "rc %d: %s", r[0].rc, r[0].err);
}

static void test_file_errors(void) {
    char path[512];
    unsigned char offer[PAYLOAD] = {3};
    Result r[3];
    file_path(path, sizeof(path), "rdzv_world");
    Proc world[2] = {{0, 2, 7, 20.0}, {1, 3, 7, 20.0}};
    run_procs_via(world, 2, 0, path, offer, r);
    test_report("file_rendezvous_world_size_mismatch_fails_on_both_sides",
                r[0].rc == -1 && r[1].rc == -1 && contains(&r[0], "rank 1 says world size 3, rank 0 says 2") &&
                    contains(&r[1], "disagrees on the world size") && r[0].seconds < 10 && r[1].seconds < 10,
                "%s | %s", r[0].err, r[1].err);
    file_path(path, sizeof(path), "rdzv_tag");
    Proc tag[2] = {{0, 2, 7, 20.0}, {1, 2, 8, 20.0}};
    run_procs_via(tag, 2, 0, path, offer, r);
    test_report("file_rendezvous_different_options_fail_on_both_sides",
                r[0].rc == -1 && r[1].rc == -1 && contains(&r[0], "other options") && contains(&r[1], "other options"),
                "%s | %s", r[0].err, r[1].err);
    file_path(path, sizeof(path), "rdzv_missing");
    Proc missing[2] = {{0, 3, 7, 1.0}, {1, 3, 7, 20.0}};
    run_procs_via(missing, 2, 0, path, offer, r);
    test_report("file_rendezvous_missing_rank_times_out_on_every_side",
                r[0].rc == -1 && r[1].rc == -1 && contains(&r[0], "only 2 of 3 ranks checked in") &&
                    contains(&r[0], "missing ranks: 2") && contains(&r[1], "only 2 of 3 ranks checked in") &&
                    r[0].seconds < 5 && r[1].seconds < 5,
                "rank 0 (%.1f s): %s | rank 1 (%.1f s): %s", r[0].seconds, r[0].err, r[1].seconds, r[1].err);
    const char* bad_path = NULL;
    char err[256] = "";
    test_report("rendezvous_method_parsing", launcher_parse_method("tcp", &bad_path, err, sizeof(err)) == 0 &&
                    launcher_parse_method("file:/x/y", &bad_path, err, sizeof(err)) == 1 && !strcmp(bad_path, "/x/y") &&
                    launcher_parse_method("file:", &bad_path, err, sizeof(err)) == -1 && strstr(err, "file:PATH"),
                "%s", err);
}

static void remove_dir(void) {
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) printf("note: could not remove %s\n", g_dir);
}

// Every group in the order it runs, with the number of cases it reports.
static const struct {
    void (*run)(void);
    int cases;
} GROUPS[] = {
    {test_detect, 7},
    {test_detect_bounds, (int)COUNT(DETECT_BOUNDS)},
    {test_rendezvous_worlds, (int)COUNT(RENDEZVOUS)},
    {test_world_mismatch, 1},
    {test_duplicate_rank_and_tag, 2},
    {test_bad_hello_rank, 1},
    {test_keep_by_rank, 1},
    {test_timeouts, 2},
    {test_file_ok, 2},
    {test_file_stale, 2},
    {test_file_errors, 4},
};

int main(void) {
    test_begin();
    int cases = 0;
    for (size_t i = 0; i < COUNT(GROUPS); i++) cases += GROUPS[i].cases;
    test_plan(cases);
    signal(SIGPIPE, SIG_IGN);
    snprintf(g_dir, sizeof(g_dir), "/tmp/test_launcher_XXXXXX");  // the file exchange's folder
    if (!mkdtemp(g_dir)) {
        test_fail("setup", "cannot make a temporary directory");
        return test_end();
    }
    for (size_t i = 0; i < COUNT(GROUPS); i++) GROUPS[i].run();
    remove_dir();
    return test_end();
}
