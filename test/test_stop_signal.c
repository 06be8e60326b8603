// test_stop_signal.c: layers/multi_gpu/stop_signal.h in forked processes: a stop signal is recorded (the
// child finishes its "step" and exits as train_gpt does), each of SIGTERM, SIGINT and SIGUSR1
// counts, and a second signal ends the process at once with 128 + its number.
#define _POSIX_C_SOURCE 200809L  // sigaction, kill under -std=c11

#include <fcntl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "layers/multi_gpu/stop_signal.h"
#include "test/test_harness.h"

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {}  // a handled signal interrupts it: sleep the rest
}

// Forks a child that installs the handler, says it is ready, and "trains" in 1 ms steps until a
// stop signal; it then says it saw it, takes `stop_ms` to "save" and exits with EXIT_STOPPED, or 99 when
// the recorded signal is not `want`. The parent sends `sig`, and when `twice` sends it again once the
// child has said it saw the first (sooner, the kernel could merge the two pending signals into one),
// and returns the child's exit status (-1 when it did not exit normally).
static int run_child(int sig, int twice, int stop_ms) {
    int ready[2], saw[2];
    if (pipe(ready) != 0 || pipe(saw) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);  // the handler's message is not this test's output
        if (devnull >= 0) dup2(devnull, STDERR_FILENO);
        if (stop_signal_install() != 0) _exit(98);
        if (write(ready[1], "r", 1) != 1) _exit(97);
        while (!stop_signal_received()) sleep_ms(1);
        if (write(saw[1], "s", 1) != 1) _exit(96);
        sleep_ms(stop_ms);
        _exit(stop_signal_received() == sig ? EXIT_STOPPED : 99);
    }
    char c;
    const int started = read(ready[0], &c, 1) == 1;
    if (started) kill(pid, sig);
    if (started && twice && read(saw[0], &c, 1) == 1) kill(pid, sig);
    for (int i = 0; i < 2; i++) close(ready[i]), close(saw[i]);
    int status = 0;
    waitpid(pid, &status, 0);
    return started && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The signals that stop a run, each a case.
static const struct {
    int sig;
    const char* name;
} STOP_SIGNALS[] = {{SIGTERM, "sigterm"}, {SIGINT, "sigint"}, {SIGUSR1, "sigusr1"}};

int main(void) {
    test_begin();
    test_plan((int)COUNT(STOP_SIGNALS) + 3);  // and the two second signals, the signal's name
    for (size_t i = 0; i < COUNT(STOP_SIGNALS); i++) {
        char name[64];
        snprintf(name, sizeof(name), "stop_signal_%s_finishes_the_step", STOP_SIGNALS[i].name);
        int rc = run_child(STOP_SIGNALS[i].sig, 0, 0);
        test_report(name, rc == EXIT_STOPPED, "exit status %d, want %d", rc, EXIT_STOPPED);
    }
    // the second signal arrives while the first one's "save" (2 s) runs: the child ends at once
    int rc = run_child(SIGTERM, 1, 2000);
    test_report("stop_signal_second_sigterm_exits_at_once", rc == 128 + SIGTERM, "exit status %d, want %d", rc,
                128 + SIGTERM);
    rc = run_child(SIGINT, 1, 2000);
    test_report("stop_signal_second_sigint_exits_at_once", rc == 128 + SIGINT, "exit status %d, want %d", rc,
                128 + SIGINT);
    test_report("stop_signal_names", strcmp(stop_signal_name(SIGUSR1), "SIGUSR1") == 0, "%s",
                stop_signal_name(SIGUSR1));
    return test_end();
}
