// stop_signal.h: stopping a run cleanly when the machine is about to be taken away.
//
// SIGTERM (what SLURM and Kubernetes send before they take a node), SIGINT (Ctrl-C) and SIGUSR1
// (e.g. `sbatch --signal=USR1@120`) ask the run to stop: the handler only records the signal and
// says on stderr what will happen; the training loop finishes its optimizer step, saves a
// checkpoint and exits (train_gpt.cu, EXIT_STOPPED). A second signal ends the process at once
// with 128 + its number, as an unhandled one would, saving nothing.
//
// Plain C (POSIX), so a CPU test can send the signals (test/test_stop_signal.c).
#ifndef STOP_SIGNAL_H
#define STOP_SIGNAL_H

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

// Exit status of a run stopped by a signal after saving its state (sysexits.h's EX_TEMPFAIL:
// "try again later"): relaunch it with --resume auto.
#define EXIT_STOPPED 75

static volatile sig_atomic_t g_stop_signal = 0;  // the first stop signal received, 0 = none

static inline const char* stop_signal_name(int sig) {
    return sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : sig == SIGUSR1 ? "SIGUSR1" : "a signal";
}

// Async-signal-safe: only write(2) and _exit.
static inline void stop_signal_write(const char* text) {
    ssize_t ignored = write(STDERR_FILENO, text, strlen(text));
    (void)ignored;
}

static inline void stop_signal_handler(int sig) {
    if (g_stop_signal) {
        stop_signal_write("\n");
        stop_signal_write(stop_signal_name(sig));
        stop_signal_write(" again: stopping now, without saving\n");
        _exit(128 + sig);
    }
    g_stop_signal = sig;
    stop_signal_write("\n");
    stop_signal_write(stop_signal_name(sig));
    stop_signal_write(": finishing this step, then saving a checkpoint and stopping (send it again to stop at "
                      "once)\n");
}

// Installs the handler for SIGTERM, SIGINT and SIGUSR1. Returns 0, or -1 when sigaction fails.
static inline int stop_signal_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = stop_signal_handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // reads and writes in progress go on
    const int signals[] = {SIGTERM, SIGINT, SIGUSR1};
    for (size_t i = 0; i < sizeof(signals) / sizeof(signals[0]); i++)
        if (sigaction(signals[i], &sa, NULL) != 0) return -1;
    return 0;
}

// The first stop signal received so far, 0 when none.
static inline int stop_signal_received(void) { return (int)g_stop_signal; }

#endif  // STOP_SIGNAL_H
