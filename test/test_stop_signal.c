// test_stop_signal.c: layers/multi_gpu/stop_signal.h in forked processes: a stop signal is recorded (the
// child finishes its "step" and exits as train_gpt does), each of SIGTERM, SIGINT and SIGUSR1
// counts, a second signal (of any kind) ends the process at once with 128 + its number, stderr says
// what happens, and a read(2) in progress when the signal comes is resumed, not failed (SA_RESTART).
#define _POSIX_C_SOURCE 200809L  // sigaction, kill under -std=c11

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
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
// the recorded signal is not `sig`. The parent sends `sig`, and when `again` is a signal sends that
// once the child has said it saw the first (sooner, the kernel could merge two pending signals into
// one), and returns the child's exit status (-1 when it did not exit normally). The child's stderr
// (the handler's messages) goes to `log` when it is not NULL, else to /dev/null.
static int run_child(int sig, int again, int stop_ms, char* log, size_t log_len) {
    int ready[2], saw[2], err[2];
    if (pipe(ready) != 0 || pipe(saw) != 0 || pipe(err) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);  // the handler's message is not this test's output
        dup2(log ? err[1] : devnull, STDERR_FILENO);
        if (stop_signal_install() != 0) _exit(98);
        if (write(ready[1], "r", 1) != 1) _exit(97);
        while (!stop_signal_received()) sleep_ms(1);
        if (write(saw[1], "s", 1) != 1) _exit(96);
        sleep_ms(stop_ms);
        _exit(stop_signal_received() == sig ? EXIT_STOPPED : 99);
    }
    close(ready[1]), close(saw[1]), close(err[1]);  // a child that dies must end the parent's reads
    char c;
    const int started = read(ready[0], &c, 1) == 1;
    if (started) kill(pid, sig);
    if (started && again && read(saw[0], &c, 1) == 1) kill(pid, again);
    close(ready[0]), close(saw[0]);
    size_t got = 0;
    ssize_t k;
    while (log && got + 1 < log_len && (k = read(err[0], log + got, log_len - 1 - got)) > 0) got += (size_t)k;
    if (log) log[got] = '\0';
    close(err[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return started && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Whether the child's state in /proc/PID/stat is S (asleep in a system call).
static int is_asleep(pid_t pid) {
    char path[64], text[256] = "";
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE* f = fopen(path, "r");
    if (!f) return 0;
    const size_t n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[n] = '\0';
    const char* paren = strrchr(text, ')');  // "pid (comm) S ...": the state follows the name
    return paren && paren[1] == ' ' && paren[2] == 'S';
}

// A stop signal that arrives while the run is blocked reading (a data loader's read) must not make
// that read fail (SA_RESTART): the child blocks in read(2) on a pipe; once it sleeps there the
// parent sends SIGTERM, waits for the handler's message (so the signal was handled during the
// read), then writes one byte. The child exits EXIT_STOPPED when its read got that byte, 95 when
// it failed with EINTR. Sent before the read began, the signal would prove nothing but fail nothing.
static int run_child_in_read(void) {
    int ready[2], data[2], err[2];
    if (pipe(ready) != 0 || pipe(data) != 0 || pipe(err) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        alarm(30);  // a parent that never writes must not leave it behind
        dup2(err[1], STDERR_FILENO);
        if (stop_signal_install() != 0) _exit(98);
        if (write(ready[1], "r", 1) != 1) _exit(97);
        char c;
        const ssize_t k = read(data[0], &c, 1);
        _exit(k == 1 && stop_signal_received() == SIGTERM ? EXIT_STOPPED : k < 0 && errno == EINTR ? 95 : 94);
    }
    close(ready[1]), close(data[0]), close(err[1]);
    char c, text[512];
    int started = read(ready[0], &c, 1) == 1;
    for (int i = 0; started && i < 5000 && !is_asleep(pid); i++) sleep_ms(1);
    if (started) kill(pid, SIGTERM);
    size_t got = 0;
    ssize_t k;
    struct pollfd pfd = {err[0], POLLIN, 0};  // at most 10 s: a handler that says nothing must not hang the test
    while (started && (got < 2 || !memchr(text + 1, '\n', got - 1)) && got + 1 < sizeof(text) &&
           poll(&pfd, 1, 10000) == 1 && (k = read(err[0], text + got, sizeof(text) - 1 - got)) > 0)
        got += (size_t)k;
    if (started && write(data[1], "d", 1) != 1) {}  // a child that already ended: its exit status says why
    close(ready[0]), close(data[1]), close(err[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return started && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The signals that stop a run, each a case.
static const struct {
    int sig;
    const char* name;
} STOP_SIGNALS[] = {{SIGTERM, "sigterm"}, {SIGINT, "sigint"}, {SIGUSR1, "sigusr1"}};

static void test_second_signals(void) {
    // the second signal arrives while the first one's "save" (2 s) runs: the child ends at once
    int rc = run_child(SIGTERM, SIGTERM, 2000, NULL, 0);
    test_report("stop_signal_second_sigterm_exits_at_once", rc == 128 + SIGTERM, "exit status %d, want %d", rc,
                128 + SIGTERM);
    rc = run_child(SIGINT, SIGINT, 2000, NULL, 0);
    test_report("stop_signal_second_sigint_exits_at_once", rc == 128 + SIGINT, "exit status %d, want %d", rc,
                128 + SIGINT);
    // Ctrl-C after SLURM's SIGTERM: the status is the second signal's, as if it had not been handled
    rc = run_child(SIGTERM, SIGINT, 2000, NULL, 0);
    test_report("stop_signal_second_signal_of_another_kind_exits_with_its_own_number", rc == 128 + SIGINT,
                "exit status %d, want %d", rc, 128 + SIGINT);
}

// What the user reads on stderr: what the first signal does and how to stop at once, then that the
// second one stops without saving; and every signal's name.
static void test_messages(void) {
    char log[1024];
    const int rc = run_child(SIGUSR1, SIGUSR1, 2000, log, sizeof(log));
    test_report("stop_signal_messages_say_what_happens",
                rc == 128 + SIGUSR1 && strstr(log, "SIGUSR1: finishing this step, then saving a checkpoint") &&
                    strstr(log, "send it again to stop at once") &&
                    strstr(log, "SIGUSR1 again: stopping now, without saving"),
                "exit status %d, stderr \"%s\"", rc, log);
    test_report("stop_signal_names", strcmp(stop_signal_name(SIGUSR1), "SIGUSR1") == 0 &&
                    strcmp(stop_signal_name(SIGTERM), "SIGTERM") == 0 &&
                    strcmp(stop_signal_name(SIGINT), "SIGINT") == 0,
                "%s %s %s", stop_signal_name(SIGTERM), stop_signal_name(SIGINT), stop_signal_name(SIGUSR1));
}

int main(void) {
    test_begin();
    test_plan((int)COUNT(STOP_SIGNALS) + 6);  // and the three second signals, the messages, the names, a read
    signal(SIGPIPE, SIG_IGN);  // a child that ended early must fail a case, not end this process in a write
    for (size_t i = 0; i < COUNT(STOP_SIGNALS); i++) {
        char name[64];
        snprintf(name, sizeof(name), "stop_signal_%s_finishes_the_step", STOP_SIGNALS[i].name);
        int rc = run_child(STOP_SIGNALS[i].sig, 0, 0, NULL, 0);
        test_report(name, rc == EXIT_STOPPED, "exit status %d, want %d", rc, EXIT_STOPPED);
    }
    test_second_signals();
    test_messages();
    const int rc = run_child_in_read();
    test_report("stop_signal_does_not_fail_a_read_in_progress", rc == EXIT_STOPPED,
                "exit status %d, want %d (95: the read failed with EINTR)", rc, EXIT_STOPPED);
    return test_end();
}
