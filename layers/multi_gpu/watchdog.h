// watchdog.h: waiting for a collective with a deadline, and the one line that says what went wrong.
//
// Plain C with no CUDA and no NCCL, so a CPU test (test/test_watchdog.c) drives it with a simulated
// collective, a fake clock and fake heartbeats. layers/multi_gpu/multi_gpu.cuh plugs in the real ones: "done"
// is cudaEventQuery of an event recorded after the collective, "async error" is
// ncclCommGetAsyncError, "peers" reads the heartbeat channel (layers/multi_gpu/heartbeat.h).
//
// One wait (watchdog_wait): the rank announces that it arrived at watched collective number `seq`
// (every rank issues the same sequence of watched collectives, so seq is comparable across ranks),
// then polls until the collective completes. It fails early when NCCL reports an asynchronous error
// or the heartbeat says a peer's process ended (or rank 0 sent its verdict), and late when the
// deadline (--nccl-timeout) passes. On failure it names a suspect:
//   1. a rank whose process ended without saying goodbye (its heartbeat socket closed: crashed,
//      killed, out of memory) — the lowest such rank;
//   2. else the lowest rank whose last heartbeat is an earlier collective: it never arrived (stuck
//      in data loading, disk, a GPU fault, or a debugger);
//   3. else "unknown": every rank arrived, so the hang is inside NCCL or the network.
// Only rank 0 sees every rank's heartbeat; it sends its verdict to the others, which wait a grace
// period for it after their own deadline. No verdict in that time means rank 0 itself is stuck or
// gone: rank 0 is the suspect. Without a heartbeat channel (peers == NULL) the suspect is "unknown"
// and the line says why.
#ifndef WATCHDOG_H
#define WATCHDOG_H

#include <stdio.h>
#include <string.h>

#define WATCHDOG_LINE 768

enum { PEER_UNKNOWN = 0, PEER_ALIVE = 1, PEER_GONE = 2, PEER_FINISHED = 3 };

// What the heartbeat knows of one rank.
typedef struct {
    int state;           // PEER_*
    long long last_seq;  // the last watched collective it said it arrived at; -1: none yet
} WatchdogPeer;

// Why the wait failed (kind) and whom to blame, as rank 0 sends it to the others.
enum { SUSPECT_NONE = 0, SUSPECT_GONE = 1, SUSPECT_BEHIND = 2, SUSPECT_ALL_ARRIVED = 3, SUSPECT_NO_VERDICT = 4,
       SUSPECT_NO_HEARTBEAT = 5 };
typedef struct {
    int kind;            // SUSPECT_*; SUSPECT_NONE: no verdict
    int rank;            // the suspect, -1: unknown
    long long last_seq;  // SUSPECT_BEHIND: the suspect's last collective
} WatchdogVerdict;

typedef enum { WATCHDOG_OK = 0, WATCHDOG_TIMEOUT = 1, WATCHDOG_ASYNC_ERROR = 2, WATCHDOG_PEER_LOST = 3 } WatchdogResult;

// The world the watchdog runs in. Every callback gets `user`.
typedef struct {
    void* user;
    double (*now)(void* user);                       // seconds, monotonic
    void (*pause)(void* user, double seconds);       // between polls
    int (*done)(void* user);                         // 1: the collective completed
    int (*async_error)(void* user, char* text, size_t len);  // nonzero: NCCL failed; text says how
    // Heartbeat, optional (NULL: none). arrive: tell the others this rank reached collective seq.
    // peers: fills peers[world] with what is known now and *verdict with rank 0's verdict (others).
    // announce: rank 0 sends its verdict to everyone.
    void (*arrive)(void* user, long long seq);
    void (*peers)(void* user, WatchdogPeer* peers, WatchdogVerdict* verdict);
    void (*announce)(void* user, const WatchdogVerdict* verdict);
    // Optional: names the collective at the moment of failure (e.g. which of several events is still
    // pending), over the name given to watchdog_wait.
    const char* (*which)(void* user, const char* given);
} WatchdogOps;

typedef struct {
    int rank, world;
    double timeout_s;      // --nccl-timeout
    double grace_s;        // a non-zero rank waits this long for rank 0's verdict after its own deadline
    double check_every_s;  // how often async errors and heartbeats are polled (the done poll is every pause)
    long long seq;         // watched collectives so far
    long long step;        // the training step, for the message
    WatchdogPeer* peers;   // (world) scratch, owned by the caller
    char line[WATCHDOG_LINE];  // the failure, one line, after a failed wait
} Watchdog;

static inline void watchdog_init(Watchdog* wd, int rank, int world, double timeout_s, WatchdogPeer* peers) {
    memset(wd, 0, sizeof(*wd));
    wd->rank = rank, wd->world = world, wd->timeout_s = timeout_s, wd->peers = peers;
    wd->grace_s = 10.0;
    wd->check_every_s = 0.05;
}

// The suspect from the heartbeat table (rank 0's view), for collective `seq`: see the top.
static inline WatchdogVerdict watchdog_suspect(const WatchdogPeer* peers, int world, int self, long long seq) {
    WatchdogVerdict v = {SUSPECT_ALL_ARRIVED, -1, -1};
    for (int r = 0; r < world; r++)
        if (r != self && peers[r].state == PEER_GONE) {
            v.kind = SUSPECT_GONE, v.rank = r;
            return v;
        }
    for (int r = 0; r < world; r++)
        if (r != self && peers[r].state != PEER_FINISHED && peers[r].last_seq < seq) {
            v.kind = SUSPECT_BEHIND, v.rank = r, v.last_seq = peers[r].last_seq;
            return v;
        }
    return v;
}

// "1 (why)" or "unknown (why)" for the message.
static inline void watchdog_describe(const WatchdogVerdict* v, long long seq, double grace_s, char* out, size_t len) {
    switch (v->kind) {
        case SUSPECT_GONE:
            snprintf(out, len, "%d (its process ended without saying goodbye: crashed, killed or out of memory; look "
                     "at its log)", v->rank);
            break;
        case SUSPECT_BEHIND:
            if (v->last_seq < 0)
                snprintf(out, len, "%d (it never arrived at a collective: stuck before the first one)", v->rank);
            else
                snprintf(out, len, "%d (it did not arrive: its last collective was %lld behind this one; stuck in "
                         "data loading, I/O or its GPU?)", v->rank, seq - v->last_seq);
            break;
        case SUSPECT_ALL_ARRIVED:
            snprintf(out, len, "unknown (every rank arrived at this collective, so the fault is inside NCCL or the "
                     "network; rerun with NCCL_DEBUG=WARN)");
            break;
        case SUSPECT_NO_VERDICT:
            snprintf(out, len, "0 (rank 0, which watches every rank, sent no verdict within %g s of the deadline: "
                     "it is stuck or gone)", grace_s);
            break;
        default:
            snprintf(out, len, "unknown (no heartbeat channel with --rendezvous file: the other ranks' logs say "
                     "which one failed first)");
    }
}

static inline int watchdog_peer_lost(const Watchdog* wd) {
    for (int r = 0; r < wd->world; r++)
        if (r != wd->rank && wd->peers[r].state == PEER_GONE) return 1;
    return 0;
}

// Polls the heartbeat; 1 when it gives a reason to stop now (a peer gone, or rank 0's verdict).
static inline int watchdog_check_peers(Watchdog* wd, const WatchdogOps* ops, WatchdogVerdict* verdict) {
    if (!ops->peers) return 0;
    verdict->kind = SUSPECT_NONE;
    ops->peers(ops->user, wd->peers, verdict);
    return verdict->kind != SUSPECT_NONE || watchdog_peer_lost(wd);
}

// Writes wd->line: "error: NCCL watchdog: rank R of W, step S, COLLECTIVE: WHAT; suspected rank: WHO".
static inline void watchdog_format(Watchdog* wd, WatchdogResult result, const char* collective, const char* error,
                                   const WatchdogVerdict* v) {
    char what[320], who[320];
    if (result == WATCHDOG_TIMEOUT)
        snprintf(what, sizeof(what), "did not complete within %g s (--nccl-timeout)", wd->timeout_s);
    else if (result == WATCHDOG_ASYNC_ERROR)
        snprintf(what, sizeof(what), "failed: NCCL reports %s", error);
    else
        snprintf(what, sizeof(what), "cannot complete: another rank failed");
    watchdog_describe(v, wd->seq, wd->grace_s, who, sizeof(who));
    snprintf(wd->line, sizeof(wd->line), "error: NCCL watchdog: rank %d of %d, step %lld, %s: %s; suspected rank: %s",
             wd->rank, wd->world, wd->step, collective, what, who);
}

// Rank 0 decides (and tells the others); the others take rank 0's verdict, waiting up to grace_s.
static inline WatchdogVerdict watchdog_decide(Watchdog* wd, const WatchdogOps* ops, WatchdogVerdict verdict) {
    if (!ops->peers) {
        WatchdogVerdict none = {SUSPECT_NO_HEARTBEAT, -1, -1};
        return none;
    }
    if (wd->rank == 0) {
        ops->peers(ops->user, wd->peers, &verdict);
        verdict = watchdog_suspect(wd->peers, wd->world, 0, wd->seq);
        if (ops->announce) ops->announce(ops->user, &verdict);
        return verdict;
    }
    const double until = ops->now(ops->user) + wd->grace_s;
    while (verdict.kind == SUSPECT_NONE) {
        if (wd->peers[0].state == PEER_GONE) {
            WatchdogVerdict gone = {SUSPECT_GONE, 0, -1};
            return gone;
        }
        if (ops->now(ops->user) >= until) {
            WatchdogVerdict silent = {SUSPECT_NO_VERDICT, 0, -1};
            return silent;
        }
        ops->pause(ops->user, wd->check_every_s);
        ops->peers(ops->user, wd->peers, &verdict);
    }
    return verdict;
}

// Waits for one collective (see the top). WATCHDOG_OK, or the failure with wd->line filled; the
// caller aborts the communicator and exits with the line. counted = 0: a wait that only some ranks
// make (NCCL said ncclInProgress on this one): no new collective number, nothing announced.
static inline WatchdogResult watchdog_wait_counted(Watchdog* wd, const WatchdogOps* ops, const char* collective,
                                                   int counted) {
    if (counted) {
        wd->seq++;
        if (ops->arrive) ops->arrive(ops->user, wd->seq);
    }
    const double start = ops->now(ops->user), deadline = start + wd->timeout_s;
    double next_check = start, pause_s = 0.0;
    WatchdogVerdict verdict = {SUSPECT_NONE, -1, -1};
    char error[256] = "";
    WatchdogResult result = WATCHDOG_OK;
    while (result == WATCHDOG_OK) {
        if (ops->done(ops->user)) return WATCHDOG_OK;
        const double t = ops->now(ops->user);
        if (t >= next_check) {  // the cheap poll above runs every time; these every check_every_s
            next_check = t + wd->check_every_s;
            if (ops->async_error(ops->user, error, sizeof(error))) result = WATCHDOG_ASYNC_ERROR;
            else if (watchdog_check_peers(wd, ops, &verdict)) result = WATCHDOG_PEER_LOST;
            else if (t >= deadline) result = WATCHDOG_TIMEOUT;
        }
        if (result == WATCHDOG_OK) {
            ops->pause(ops->user, pause_s);
            pause_s = pause_s == 0.0 ? 1e-6 : (pause_s < 1e-4 ? pause_s * 2 : 1e-4);  // spin briefly, then 100 µs
        }
    }
    if (result == WATCHDOG_PEER_LOST && ops->done(ops->user)) return WATCHDOG_OK;  // it finished meanwhile
    verdict = watchdog_decide(wd, ops, verdict);
    watchdog_format(wd, result, ops->which ? ops->which(ops->user, collective) : collective, error, &verdict);
    return result;
}

static inline WatchdogResult watchdog_wait(Watchdog* wd, const WatchdogOps* ops, const char* collective) {
    return watchdog_wait_counted(wd, ops, collective, 1);
}

#endif  // WATCHDOG_H
