// test_watchdog.c: layers/multi_gpu/watchdog.h driven by a simulated collective (a fake clock; completion, NCCL
// async errors, heartbeats and rank 0's verdict scripted in time), and layers/multi_gpu/heartbeat.h over real
// sockets between forked processes, kept open after a real TCP rendezvous (layers/multi_gpu/launcher.h):
// a killed rank is seen at once, a clean BYE is not a failure, the verdict reaches the other rank,
// and a wait on a collective that never completes ends within the timeout with one line naming the
// step, the collective and the suspect. Over socket pairs: rank 0 reads ranks beyond its first 64
// sockets, puts split messages together, and its verdict reaches every rank whole.
#define _POSIX_C_SOURCE 200809L  // fork, kill, socketpair under -std=c11

#include <signal.h>
#include <sys/wait.h>

#include "layers/multi_gpu/heartbeat.h"
#include "layers/multi_gpu/launcher.h"
#include "layers/multi_gpu/watchdog.h"
#include "test/test_harness.h"
#include "test/test_ports.h"

#define WORLD 4

// ---- a simulated collective ------------------------------------------------------------------------
typedef struct {
    double t;               // the fake clock (s)
    double done_at;         // the collective completes then; < 0: never
    long long done_at_poll; // or at this done() poll (the first is 1); 0: never
    double error_at;        // NCCL reports an async error then; < 0: never
    double gone_at;         // peer `gone_rank` ends then (heartbeat socket closed); < 0: never
    int gone_rank;
    double verdict_at;      // rank 0's verdict arrives then (other ranks); < 0: never
    WatchdogVerdict verdict;
    long long peer_seq[WORLD];  // the heartbeat table's last collectives (-2: follow the waiting rank)
    int heartbeat;          // 0: no heartbeat channel (peers == NULL)
    long long arrived;      // what arrive() was told
    int announced;          // announce() calls
    WatchdogVerdict announced_verdict;
    long long polls;
} Sim;

static double sim_now(void* u) { return ((Sim*)u)->t; }
static void sim_pause(void* u, double s) { ((Sim*)u)->t += s > 0 ? s : 1e-7; }  // a poll costs time too
static int sim_done(void* u) {
    Sim* s = (Sim*)u;
    s->polls++;
    return (s->done_at >= 0 && s->t >= s->done_at) || (s->done_at_poll > 0 && s->polls >= s->done_at_poll);
}
static int sim_async_error(void* u, char* text, size_t len) {
    Sim* s = (Sim*)u;
    if (s->error_at < 0 || s->t < s->error_at) return 0;
    snprintf(text, len, "ncclRemoteError (remote process exited or there was a network error)");
    return 1;
}
static void sim_arrive(void* u, long long seq) { ((Sim*)u)->arrived = seq; }
static void sim_peers(void* u, WatchdogPeer* peers, WatchdogVerdict* verdict) {
    Sim* s = (Sim*)u;
    for (int r = 0; r < WORLD; r++) {
        peers[r].state = PEER_ALIVE;
        peers[r].last_seq = s->peer_seq[r] == -2 ? s->arrived : s->peer_seq[r];
    }
    if (s->gone_at >= 0 && s->t >= s->gone_at) peers[s->gone_rank].state = PEER_GONE;
    if (s->verdict_at >= 0 && s->t >= s->verdict_at) *verdict = s->verdict;
}
static void sim_announce(void* u, const WatchdogVerdict* v) {
    Sim* s = (Sim*)u;
    s->announced++;
    s->announced_verdict = *v;
}

static void sim_reset(Sim* s) {
    memset(s, 0, sizeof(*s));
    s->done_at = s->error_at = s->gone_at = s->verdict_at = -1;
    for (int r = 0; r < WORLD; r++) s->peer_seq[r] = -2;
    s->heartbeat = 1;
}

static WatchdogOps sim_ops(Sim* s) {
    WatchdogOps ops = {s, sim_now, sim_pause, sim_done, sim_async_error, sim_arrive, sim_peers, sim_announce, NULL};
    if (!s->heartbeat) ops.arrive = NULL, ops.peers = NULL, ops.announce = NULL;
    return ops;
}

// One wait of rank `rank` at step 7 (after `earlier` completed collectives) with a 300 s timeout.
static WatchdogResult sim_wait(Sim* s, Watchdog* wd, WatchdogPeer* table, int rank, int earlier, const char* what) {
    watchdog_init(wd, rank, WORLD, 300.0, table);
    wd->seq = earlier;
    wd->step = 7;
    WatchdogOps ops = sim_ops(s);
    return watchdog_wait(wd, &ops, what);
}

static int has(const Watchdog* wd, const char* text) { return strstr(wd->line, text) != NULL; }
static int one_line(const Watchdog* wd) { return strchr(wd->line, '\n') == NULL && wd->line[0] != '\0'; }

static void test_completes(void) {
    Sim s;
    sim_reset(&s);
    s.done_at = 12.0;
    Watchdog wd;
    WatchdogPeer table[WORLD];
    WatchdogResult r = sim_wait(&s, &wd, table, 1, 41, "gradient all-reduce");
    test_report("watchdog_collective_that_completes_returns_ok", r == WATCHDOG_OK && s.t >= 12.0 && s.t < 12.01 &&
                    wd.seq == 42 && s.arrived == 42 && wd.line[0] == '\0',
                "result %d at t=%.4f seq %lld arrived %lld line \"%s\"", r, s.t, wd.seq, s.arrived, wd.line);
    // Many waits in a row: the time a completed collective costs is one poll, no fixed sleep.
    // A wait only this rank makes (NCCL said ncclInProgress): no collective number, nothing announced.
    sim_reset(&s);
    s.done_at = 1.0;
    watchdog_init(&wd, 1, WORLD, 300.0, table);
    wd.seq = 5;
    WatchdogOps ops = sim_ops(&s);
    r = watchdog_wait_counted(&wd, &ops, "enqueue", 0);
    test_report("watchdog_uncounted_wait_keeps_the_collective_number", r == WATCHDOG_OK && wd.seq == 5 &&
                    s.arrived == 0, "result %d seq %lld arrived %lld", r, wd.seq, s.arrived);
    sim_reset(&s);
    s.done_at = 0.0;
    r = sim_wait(&s, &wd, table, 0, 0, "x");
    test_report("watchdog_completed_collective_costs_one_poll", r == WATCHDOG_OK && s.polls == 1 && s.t == 0.0,
                "result %d polls %lld t %g", r, s.polls, s.t);
}

static void test_timeouts(void) {
    Sim s;
    Watchdog wd;
    WatchdogPeer table[WORLD];
    sim_reset(&s);
    s.heartbeat = 0;
    WatchdogResult r = sim_wait(&s, &wd, table, 2, 10, "(norm, loss, stop) all-reduce");
    test_report("watchdog_timeout_without_heartbeat_names_step_collective_and_unknown",
                r == WATCHDOG_TIMEOUT && s.t >= 300.0 && s.t < 300.2 && one_line(&wd) &&
                    has(&wd, "rank 2 of 4, step 7, (norm, loss, stop) all-reduce: did not complete within 300 s") &&
                    has(&wd, "suspected rank: unknown (no heartbeat channel"),
                "result %d at t=%.3f: %s", r, s.t, wd.line);

    sim_reset(&s);
    s.peer_seq[3] = 9;  // rank 3 is one collective behind
    s.peer_seq[1] = 9;  // so is rank 1: the lowest is named
    r = sim_wait(&s, &wd, table, 0, 9, "gradient reduce (ZeRO-1)");
    test_report("watchdog_rank0_timeout_suspects_the_rank_that_did_not_arrive",
                r == WATCHDOG_TIMEOUT && s.t >= 300.0 && s.t < 300.2 && one_line(&wd) &&
                    has(&wd, "suspected rank: 1 (it did not arrive: its last collective was 1 behind") &&
                    s.announced == 1 && s.announced_verdict.kind == SUSPECT_BEHIND && s.announced_verdict.rank == 1,
                "result %d at t=%.3f announced %d (%d, rank %d): %s", r, s.t, s.announced, s.announced_verdict.kind,
                s.announced_verdict.rank, wd.line);

    sim_reset(&s);
    r = sim_wait(&s, &wd, table, 0, 3, "gradient all-reduce");
    test_report("watchdog_rank0_timeout_with_everyone_arrived_blames_nccl",
                r == WATCHDOG_TIMEOUT && has(&wd, "suspected rank: unknown (every rank arrived") && s.announced == 1 &&
                    s.announced_verdict.kind == SUSPECT_ALL_ARRIVED && s.announced_verdict.rank == -1,
                "result %d: %s", r, wd.line);

    sim_reset(&s);
    s.verdict_at = 303.0;  // rank 0 decides 3 s after this rank's deadline
    s.verdict = (WatchdogVerdict){SUSPECT_BEHIND, 3, 4};
    r = sim_wait(&s, &wd, table, 1, 5, "gradient all-reduce");
    test_report("watchdog_other_rank_takes_rank0_verdict_after_its_deadline",
                r == WATCHDOG_TIMEOUT && s.t >= 303.0 && s.t < 303.2 && has(&wd, "suspected rank: 3 (") &&
                    has(&wd, "2 behind") && s.announced == 0,
                "result %d at t=%.3f announced %d: %s", r, s.t, s.announced, wd.line);

    sim_reset(&s);  // rank 0 says nothing: after the grace period rank 0 is the suspect
    r = sim_wait(&s, &wd, table, 2, 5, "gradient all-reduce");
    test_report("watchdog_silent_rank0_is_the_suspect_after_the_grace_period",
                r == WATCHDOG_TIMEOUT && s.t >= 310.0 && s.t < 310.3 && has(&wd, "suspected rank: 0 (rank 0") &&
                    has(&wd, "no verdict within 10 s"),
                "result %d at t=%.3f: %s", r, s.t, wd.line);
}

static void test_early_failures(void) {
    Sim s;
    Watchdog wd;
    WatchdogPeer table[WORLD];
    sim_reset(&s);
    s.error_at = 5.0;
    WatchdogResult r = sim_wait(&s, &wd, table, 0, 0, "gradient all-reduce");
    test_report("watchdog_async_error_fails_at_once_with_nccls_reason",
                r == WATCHDOG_ASYNC_ERROR && s.t >= 5.0 && s.t < 5.2 && one_line(&wd) &&
                    has(&wd, "failed: NCCL reports ncclRemoteError") && has(&wd, "step 7, gradient all-reduce"),
                "result %d at t=%.3f: %s", r, s.t, wd.line);

    sim_reset(&s);
    s.gone_at = 3.0, s.gone_rank = 2;
    s.peer_seq[3] = -1;  // rank 3 never arrived either, but a dead process comes first
    r = sim_wait(&s, &wd, table, 0, 0, "gradient all-reduce");
    test_report("watchdog_rank0_sees_a_dead_rank_long_before_the_timeout",
                r == WATCHDOG_PEER_LOST && s.t >= 3.0 && s.t < 3.2 && one_line(&wd) &&
                    has(&wd, "cannot complete: another rank failed") &&
                    has(&wd, "suspected rank: 2 (its process ended without saying goodbye") && s.announced == 1 &&
                    s.announced_verdict.kind == SUSPECT_GONE && s.announced_verdict.rank == 2,
                "result %d at t=%.3f announced %d: %s", r, s.t, s.announced, wd.line);

    sim_reset(&s);
    s.verdict_at = 4.0;
    s.verdict = (WatchdogVerdict){SUSPECT_GONE, 2, -1};
    r = sim_wait(&s, &wd, table, 3, 0, "ZeRO-1 all-gather of the weights");
    test_report("watchdog_other_rank_stops_on_rank0s_verdict_at_once",
                r == WATCHDOG_PEER_LOST && s.t >= 4.0 && s.t < 4.2 && has(&wd, "suspected rank: 2 (its process ended"),
                "result %d at t=%.3f: %s", r, s.t, wd.line);

    sim_reset(&s);
    s.gone_at = 1.0, s.gone_rank = 0;
    r = sim_wait(&s, &wd, table, 1, 0, "gradient all-reduce");
    test_report("watchdog_other_rank_sees_rank0_gone", r == WATCHDOG_PEER_LOST && s.t < 1.2 &&
                    has(&wd, "suspected rank: 0 (its process ended"), "result %d at t=%.3f: %s", r, s.t, wd.line);

    sim_reset(&s);  // the collective completed between the last poll and the peer's exit: not a failure
    s.done_at = 2.0, s.gone_at = 2.0, s.gone_rank = 1;
    r = sim_wait(&s, &wd, table, 0, 0, "gradient all-reduce");
    test_report("watchdog_completion_wins_over_a_peer_that_left_after_it", r == WATCHDOG_OK, "result %d: %s", r,
                wd.line);
}

static void test_suspect_rules(void) {
    WatchdogPeer p[4] = {{PEER_ALIVE, 5}, {PEER_FINISHED, 2}, {PEER_ALIVE, 4}, {PEER_GONE, 5}};
    WatchdogVerdict v = watchdog_suspect(p, 4, 0, 5);
    test_report("watchdog_suspect_prefers_a_dead_process", v.kind == SUSPECT_GONE && v.rank == 3, "kind %d rank %d",
                v.kind, v.rank);
    p[3].state = PEER_ALIVE;
    v = watchdog_suspect(p, 4, 0, 5);
    test_report("watchdog_suspect_skips_ranks_that_said_goodbye", v.kind == SUSPECT_BEHIND && v.rank == 2 &&
                    v.last_seq == 4, "kind %d rank %d last %lld", v.kind, v.rank, v.last_seq);
}

// The suspect's line when it never reached any watched collective, and the race the wait resolves in
// favour of the collective: it completed in the instant between the poll that found it pending and
// the heartbeat saying a peer left (the peer had done its part): not a failure.
static void test_never_arrived_and_late_completion(void) {
    Sim s;
    Watchdog wd;
    WatchdogPeer table[WORLD];
    sim_reset(&s);
    s.peer_seq[2] = -1;
    WatchdogResult r = sim_wait(&s, &wd, table, 0, 0, "gradient all-reduce");
    test_report("watchdog_rank_that_never_arrived_is_named_as_such",
                r == WATCHDOG_TIMEOUT && has(&wd, "suspected rank: 2 (it never arrived at a collective"),
                "result %d: %s", r, wd.line);
    sim_reset(&s);
    s.gone_at = 0.0, s.gone_rank = 2;  // rank 2 is gone from the start
    s.done_at_poll = 2;                // the first poll finds the collective pending, the next complete
    r = sim_wait(&s, &wd, table, 0, 0, "gradient all-reduce");
    test_report("watchdog_collective_completed_when_a_peer_loss_is_seen_is_ok", r == WATCHDOG_OK && s.polls == 2,
                "result %d after %lld polls: %s", r, s.polls, wd.line);
}

// ---- the heartbeat over socket pairs: rank 0's table and the verdict, without processes ------------------

// Rank 0's heartbeat over `world` socket pairs; peer[r] is rank r's end (peer[0] = -1).
static int pair_up(Heartbeat* hb, int world, int* peer) {
    int* fds = (int*)malloc(sizeof(int) * (size_t)world);
    fds[0] = peer[0] = -1;
    for (int r = 1; r < world; r++) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return -1;
        fds[r] = sv[0], peer[r] = sv[1];
    }
    heartbeat_init(hb, 0, world, fds);
    return 0;
}

static int send_raw(int fd, const void* data, size_t n) { return write(fd, data, n) == (ssize_t)n ? 0 : -1; }

// 70 ranks (a 9-node job): rank 0 polls its sockets in chunks of 64, so the beats of ranks 64..69
// and the death of rank 69 must be seen as well as rank 1's.
static void test_heartbeat_beyond_64(void) {
    enum { W = 70 };
    Heartbeat hb;
    int peer[W], ok = pair_up(&hb, W, peer) == 0;
    for (int r = 1; ok && r < W; r++) {
        HeartbeatMessage m = {HEARTBEAT_BEAT, r, 0, 0, 100 + r};
        ok = send_raw(peer[r], &m, sizeof(m)) == 0;
    }
    if (ok) close(peer[W - 1]), peer[W - 1] = -1;
    WatchdogPeer table[W];
    WatchdogVerdict v = {SUSPECT_NONE, -1, -1};
    if (ok) heartbeat_poll(&hb, table, &v);
    int wrong = -1;
    for (int r = 1; ok && r < W - 1 && wrong < 0; r++)
        if (table[r].state != PEER_ALIVE || table[r].last_seq != 100 + r) wrong = r;
    test_report("heartbeat_rank0_reads_every_socket_beyond_the_first_64",
                ok && wrong < 0 && table[W - 1].state == PEER_GONE && table[W - 1].last_seq == 100 + W - 1,
                "setup %d, first wrong rank %d (state %d, last %lld), rank %d state %d (want gone)", ok, wrong,
                wrong >= 0 ? table[wrong].state : -1, wrong >= 0 ? table[wrong].last_seq : -1, W - 1,
                ok ? table[W - 1].state : -1);
    for (int r = 1; r < W; r++)
        if (peer[r] >= 0) close(peer[r]);
    if (ok) heartbeat_close(&hb);
}

// A message that arrives in pieces (TCP may split it anywhere) is put together before it is read:
// 10 bytes of BEAT 5, then its other 14 bytes with the whole BEAT 6 behind them.
static void test_heartbeat_split_message(void) {
    Heartbeat hb;
    int peer[2], ok = pair_up(&hb, 2, peer) == 0;
    HeartbeatMessage m[2] = {{HEARTBEAT_BEAT, 1, 0, 0, 5}, {HEARTBEAT_BEAT, 1, 0, 0, 6}};
    WatchdogPeer table[2];
    long long after_part = -9, after_rest = -9;
    if (ok && send_raw(peer[1], m, 10) == 0) heartbeat_poll(&hb, table, NULL), after_part = table[1].last_seq;
    if (ok && send_raw(peer[1], (char*)m + 10, sizeof(m) - 10) == 0)
        heartbeat_poll(&hb, table, NULL), after_rest = table[1].last_seq;
    test_report("heartbeat_message_split_across_reads_is_put_together",
                after_part == -1 && after_rest == 6 && table[1].state == PEER_ALIVE,
                "last collective %lld after 10 bytes (want -1), %lld after all (want 6)", after_part, after_rest);
    if (ok) close(peer[1]), heartbeat_close(&hb);
}

// Rank 0's verdict reaches every rank, not just rank 1, and each reads it whole: suspect, kind and the
// suspect's last collective (which the line's "N behind" is computed from).
static void test_heartbeat_verdict_everywhere(void) {
    enum { W = 4 };
    Heartbeat hb, other;
    int peer[W], ok = pair_up(&hb, W, peer) == 0, wrong = -1;
    WatchdogVerdict sent = {SUSPECT_BEHIND, 2, 17}, got = {SUSPECT_NONE, -1, -1};
    if (ok) heartbeat_announce(&hb, &sent);
    for (int r = 1; ok && r < W && wrong < 0; r++) {
        int* fds = (int*)malloc(sizeof(int) * W);
        for (int i = 0; i < W; i++) fds[i] = i == 0 ? peer[r] : -1;
        heartbeat_init(&other, r, W, fds);  // rank r's side, over its end of the pair
        got = (WatchdogVerdict){SUSPECT_NONE, -1, -1};
        heartbeat_poll(&other, NULL, &got);
        if (got.kind != sent.kind || got.rank != sent.rank || got.last_seq != sent.last_seq) wrong = r;
        heartbeat_close(&other);  // closes peer[r]
    }
    test_report("heartbeat_verdict_reaches_every_rank_whole", ok && wrong < 0,
                "setup %d; rank %d got kind %d rank %d last %lld (sent %d, %d, %lld)", ok, wrong, got.kind, got.rank,
                got.last_seq, sent.kind, sent.rank, sent.last_seq);
    if (ok) heartbeat_close(&hb);
}

// ---- the heartbeat over real sockets -----------------------------------------------------------------

typedef struct {
    Heartbeat* hb;
} RealCtx;
static double real_now(void* u) { (void)u; return launcher_now(); }
static void real_pause(void* u, double s) {
    (void)u;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}
static int never_done(void* u) { (void)u; return 0; }
static int no_error(void* u, char* t, size_t n) { (void)u, (void)t, (void)n; return 0; }
static void real_arrive(void* u, long long seq) { heartbeat_arrive(((RealCtx*)u)->hb, seq); }
static void real_peers(void* u, WatchdogPeer* p, WatchdogVerdict* v) { heartbeat_poll(((RealCtx*)u)->hb, p, v); }
static void real_announce(void* u, const WatchdogVerdict* v) { heartbeat_announce(((RealCtx*)u)->hb, v); }

static LaunchInfo test_info(int rank, int world, int port) {
    LaunchInfo li;
    memset(&li, 0, sizeof(li));
    li.rank = rank, li.world = world, li.local_rank = -1, li.source = "test", li.master_port = port;
    snprintf(li.master_addr, sizeof(li.master_addr), "127.0.0.1");
    return li;
}

// Rank 1 in a child: joins the TCP rendezvous keeping its socket, arrives at collectives 1..3, then
// `how`: 0 = killed by the parent (waits), 1 = says BYE and exits, 2 = waits for rank 0's verdict
// and exits with 10 + the suspect's rank.
static pid_t spawn_rank1(int port, int how) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    alarm(30);
    LaunchInfo li = test_info(1, 2, port);
    int* fds = (int*)malloc(2 * sizeof(int));
    fds[0] = fds[1] = -1;
    unsigned char id[128];
    char err[1024];
    if (launcher_rendezvous_keep(&li, NULL, 99, id, sizeof(id), 10.0, fds, err, sizeof(err)) != 0 || fds[0] < 0)
        _exit(3);
    Heartbeat hb;
    heartbeat_init(&hb, 1, 2, fds);
    for (long long seq = 1; seq <= 3; seq++) heartbeat_arrive(&hb, seq);
    if (how == 1) {
        heartbeat_goodbye(&hb);
        heartbeat_close(&hb);
        _exit(0);
    }
    WatchdogVerdict v = {SUSPECT_NONE, -1, -1};
    for (;;) {
        heartbeat_poll(&hb, NULL, &v);
        if (how == 2 && v.kind != SUSPECT_NONE) _exit(10 + v.rank);
        if (how == 2 && hb.table[0].state == PEER_GONE) _exit(4);
        real_pause(NULL, 0.01);
    }
}

// Rank 0 in this process: the rendezvous, keeping its socket to rank 1.
static int serve_rank0(int port, Heartbeat* hb) {
    LaunchInfo li = test_info(0, 2, port);
    int* fds = (int*)malloc(2 * sizeof(int));
    fds[0] = fds[1] = -1;
    unsigned char id[128] = {7};
    char err[1024];
    if (launcher_rendezvous_keep(&li, NULL, 99, id, sizeof(id), 10.0, fds, err, sizeof(err)) != 0 || fds[1] < 0) {
        printf("rendezvous failed: %s\n", err);
        free(fds);
        return -1;
    }
    heartbeat_init(hb, 0, 2, fds);
    return 0;
}

// Polls until rank 1's last collective is 3 (or 5 s).
static void wait_for_beats(Heartbeat* hb) {
    const double until = launcher_now() + 5.0;
    while (launcher_now() < until && hb->table[1].last_seq < 3) {
        heartbeat_poll(hb, NULL, NULL);
        real_pause(NULL, 0.005);
    }
}

static void test_heartbeat_kill(void) {
    const int port = test_free_port(29557);
    pid_t child = spawn_rank1(port, 0);
    Heartbeat hb;
    int ok = serve_rank0(port, &hb) == 0;
    if (ok) wait_for_beats(&hb);
    const long long seen = ok ? hb.table[1].last_seq : -9;
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    WatchdogPeer table[2];
    RealCtx ctx = {&hb};
    WatchdogOps ops = {&ctx, real_now, real_pause, never_done, no_error, real_arrive, real_peers, real_announce, NULL};
    Watchdog wd;
    watchdog_init(&wd, 0, 2, 30.0, table);
    wd.seq = 3, wd.step = 12;
    const double t0 = launcher_now();
    WatchdogResult r = ok ? watchdog_wait(&wd, &ops, "gradient all-reduce") : WATCHDOG_OK;
    const double took = launcher_now() - t0;
    test_report("heartbeat_rank0_sees_killed_rank_within_a_poll_not_the_timeout",
                ok && seen == 3 && r == WATCHDOG_PEER_LOST && took < 2.0 &&
                    has(&wd, "rank 0 of 2, step 12, gradient all-reduce: cannot complete") &&
                    has(&wd, "suspected rank: 1 (its process ended"),
                "rendezvous ok %d, beats seen %lld, result %d after %.2f s: %s", ok, seen, r, took, wd.line);
    if (ok) heartbeat_close(&hb);
}

static void test_heartbeat_bye_and_verdict(void) {
    int port = test_free_port(29557);
    pid_t child = spawn_rank1(port, 1);
    Heartbeat hb;
    int ok = serve_rank0(port, &hb) == 0;
    waitpid(child, NULL, 0);
    if (ok) {
        wait_for_beats(&hb);
        heartbeat_poll(&hb, NULL, NULL);
    }
    test_report("heartbeat_goodbye_is_not_a_failure", ok && hb.table[1].state == PEER_FINISHED &&
                    hb.table[1].last_seq == 3, "state %d last %lld", ok ? hb.table[1].state : -1,
                ok ? hb.table[1].last_seq : -1);
    if (ok) heartbeat_close(&hb);

    port = test_free_port(29557);
    child = spawn_rank1(port, 2);
    ok = serve_rank0(port, &hb) == 0;
    if (ok) wait_for_beats(&hb);
    WatchdogVerdict v = {SUSPECT_BEHIND, 1, 2};
    if (ok) heartbeat_announce(&hb, &v);
    int status = 0;
    waitpid(child, &status, 0);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    test_report("heartbeat_verdict_reaches_the_other_rank", ok && code == 11, "child exit %d (want 11)", code);
    if (ok) heartbeat_close(&hb);
}

// Every group in the order it runs, with the number of cases it reports.
static const struct {
    void (*run)(void);
    int cases;
} GROUPS[] = {
    {test_completes, 3},
    {test_timeouts, 5},
    {test_early_failures, 5},
    {test_suspect_rules, 2},
    {test_never_arrived_and_late_completion, 2},
    {test_heartbeat_beyond_64, 1},
    {test_heartbeat_split_message, 1},
    {test_heartbeat_verdict_everywhere, 1},
    {test_heartbeat_kill, 1},
    {test_heartbeat_bye_and_verdict, 2},
};

int main(void) {
    test_begin();
    int cases = 0;
    for (size_t i = 0; i < sizeof(GROUPS) / sizeof(GROUPS[0]); i++) cases += GROUPS[i].cases;
    test_plan(cases);
    signal(SIGPIPE, SIG_IGN);
    for (size_t i = 0; i < sizeof(GROUPS) / sizeof(GROUPS[0]); i++) GROUPS[i].run();
    return test_end();
}
