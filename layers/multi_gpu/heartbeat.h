// heartbeat.h: a cheap host-side channel beside NCCL that says which rank is alive and how far it
// got, for the watchdog's suspect (layers/multi_gpu/watchdog.h). Plain C (POSIX sockets), CPU-tested in
// test/test_watchdog.c.
//
// The TCP rendezvous (layers/multi_gpu/launcher.h) leaves its connections open: a star, rank 0 holding one
// socket to every other rank. Over it each rank sends rank 0 a 24-byte message when it arrives at a
// watched collective (BEAT, the collective's number) and when it ends cleanly (BYE); rank 0 reads
// them without blocking whenever it polls, so its table says, for every rank, the last collective
// it reached and whether its process is still there: a socket closed without BYE means the process
// ended (the kernel closes the sockets of a crashed or killed process), which rank 0 sees within
// one poll — long before the timeout. When a wait fails rank 0 sends its VERDICT to every rank.
// Costs one small send per watched collective (a few per step) and one poll(2) on rank 0.
//
// Message: int32 type, int32 rank, int32 kind, int32 unused, int64 value (little-endian hosts).
//   BEAT    value = collective number      BYE    (nothing)
//   VERDICT rank = suspect (-1 unknown), kind = SUSPECT_*, value = the suspect's last collective
#ifndef HEARTBEAT_H
#define HEARTBEAT_H

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "layers/multi_gpu/launcher.h"
#include "layers/multi_gpu/watchdog.h"

enum { HEARTBEAT_BEAT = 1, HEARTBEAT_BYE = 2, HEARTBEAT_VERDICT = 3 };
typedef struct { int32_t type, rank, kind, unused; int64_t value; } HeartbeatMessage;

typedef struct {
    int rank, world;
    int* fds;               // (world): rank 0: fds[r] its socket to rank r; others: fds[0]; -1 = none
    HeartbeatMessage* partial;  // (world) a message read in part
    int* have;              // (world) its bytes so far
    WatchdogPeer* table;    // (world) what is known of every rank
    WatchdogVerdict verdict;  // rank 0's, once received (others)
} Heartbeat;

// Takes over `fds` (world entries, from launcher_rendezvous_keep; freed by heartbeat_close).
static inline void heartbeat_init(Heartbeat* hb, int rank, int world, int* fds) {
    memset(hb, 0, sizeof(*hb));
    hb->rank = rank, hb->world = world, hb->fds = fds;
    hb->partial = (HeartbeatMessage*)calloc((size_t)world, sizeof(HeartbeatMessage));
    hb->have = (int*)calloc((size_t)world, sizeof(int));
    hb->table = (WatchdogPeer*)calloc((size_t)world, sizeof(WatchdogPeer));
    for (int r = 0; r < world; r++) {
        hb->table[r].state = fds[r] >= 0 || r == rank ? PEER_ALIVE : PEER_UNKNOWN;
        hb->table[r].last_seq = -1;
    }
}

static inline void heartbeat_send(int fd, int type, int rank, int kind, long long value) {
    if (fd < 0) return;
    HeartbeatMessage m = {type, rank, kind, 0, value};
    launcher_io(fd, &m, sizeof(m), 1, launcher_now() + 0.5);  // a full buffer (a stuck reader): give up
}

static inline void heartbeat_take(Heartbeat* hb, int from, const HeartbeatMessage* m) {
    if (m->type == HEARTBEAT_BEAT) hb->table[from].last_seq = m->value;
    if (m->type == HEARTBEAT_BYE) hb->table[from].state = PEER_FINISHED;
    if (m->type == HEARTBEAT_VERDICT) {
        hb->verdict.kind = m->kind, hb->verdict.rank = m->rank, hb->verdict.last_seq = m->value;
    }
}

// Reads what socket `r` has without blocking; a closed socket marks rank r gone (unless it said BYE).
static inline void heartbeat_drain(Heartbeat* hb, int r) {
    for (;;) {
        char* into = (char*)&hb->partial[r] + hb->have[r];
        ssize_t k = recv(hb->fds[r], into, sizeof(HeartbeatMessage) - (size_t)hb->have[r], MSG_DONTWAIT);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (k <= 0) {  // closed or reset
            if (hb->table[r].state != PEER_FINISHED) hb->table[r].state = PEER_GONE;
            close(hb->fds[r]);
            hb->fds[r] = -1;
            return;
        }
        hb->have[r] += (int)k;
        if (hb->have[r] == (int)sizeof(HeartbeatMessage)) {
            heartbeat_take(hb, r, &hb->partial[r]);
            hb->have[r] = 0;
        }
    }
}

// Reads every socket that has something (one poll(2)); copies the table and the verdict out.
static inline void heartbeat_poll(Heartbeat* hb, WatchdogPeer* peers, WatchdogVerdict* verdict) {
    struct pollfd pfds[64];
    int idx[64];
    for (int r0 = 0; r0 < hb->world; r0 += 64) {  // in chunks of 64 sockets
        int n = 0;
        for (int r = r0; r < hb->world && r < r0 + 64; r++)
            if (hb->fds[r] >= 0) pfds[n].fd = hb->fds[r], pfds[n].events = POLLIN, pfds[n].revents = 0, idx[n++] = r;
        if (n > 0 && poll(pfds, (nfds_t)n, 0) > 0)
            for (int i = 0; i < n; i++)
                if (pfds[i].revents) heartbeat_drain(hb, idx[i]);
    }
    if (peers) memcpy(peers, hb->table, sizeof(WatchdogPeer) * (size_t)hb->world);
    if (verdict) *verdict = hb->verdict;
}

// This rank arrived at watched collective `seq`.
static inline void heartbeat_arrive(Heartbeat* hb, long long seq) {
    hb->table[hb->rank].last_seq = seq;
    if (hb->rank != 0) heartbeat_send(hb->fds[0], HEARTBEAT_BEAT, hb->rank, 0, seq);
    else heartbeat_poll(hb, NULL, NULL);  // rank 0 reads as it goes, so no socket fills up
}

// Rank 0: its verdict to every rank still connected.
static inline void heartbeat_announce(Heartbeat* hb, const WatchdogVerdict* v) {
    if (hb->rank != 0) return;
    for (int r = 1; r < hb->world; r++) heartbeat_send(hb->fds[r], HEARTBEAT_VERDICT, v->rank, v->kind, v->last_seq);
}

// A clean end (the run finished, or every rank stops together): tells rank 0, or every rank, that
// the closing socket is not a failure.
static inline void heartbeat_goodbye(Heartbeat* hb) {
    for (int r = 0; r < hb->world; r++)
        if (r != hb->rank) heartbeat_send(hb->fds[r], HEARTBEAT_BYE, hb->rank, 0, 0);
}

static inline void heartbeat_close(Heartbeat* hb) {
    for (int r = 0; hb->fds && r < hb->world; r++)
        if (hb->fds[r] >= 0) close(hb->fds[r]);
    free(hb->fds);
    free(hb->partial);
    free(hb->have);
    free(hb->table);
    memset(hb, 0, sizeof(*hb));
}

#endif  // HEARTBEAT_H
