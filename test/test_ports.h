// test_ports.h: a free TCP port on the loopback for the CPU tests that start several processes
// talking over sockets (test_launcher.c, test_watchdog.c).
#ifndef TEST_PORTS_H
#define TEST_PORTS_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

// A port nobody listens on right now (bind to 0, read it back, close); `fallback` if that fails.
static inline int test_free_port(int fallback) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(sa);
    if (s < 0 || bind(s, (struct sockaddr*)&sa, sizeof(sa)) != 0 || getsockname(s, (struct sockaddr*)&sa, &len) != 0) {
        if (s >= 0) close(s);
        return fallback;
    }
    close(s);
    return ntohs(sa.sin_port);
}

#endif  // TEST_PORTS_H
