/*
 * The floor under an 8-byte two-rank AllReduce over loopback TCP: two processes
 * exchange 8 bytes per iteration (send, then spin on a non-blocking recv), once over
 * ONE bidirectional socket (what Open MPI's TCP BTL opens per peer pair) and once
 * over TWO one-way sockets (what NCCL's net API gives a transport: a send comm and a
 * separate receive comm per peer). With one-way sockets every small message is
 * answered by a pure TCP ACK, which a bidirectional socket piggybacks on the reply.
 * A third run uses two one-way sockets whose receiving side delays its ACKs
 * (TCP_QUICKACK off, re-armed every 64 messages), as cclkit-socket's receive comms
 * do for small messages: the kernel then ACKs every second small segment.
 *
 *   cc -O2 -o tcp_exchange tcp_exchange.c && ./tcp_exchange [iterations]
 *
 * Prints one line per model: "<model>: <us> us per exchange". Used by compare.sh.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what)
{
    fprintf(stderr, "tcp_exchange: %s: %s\n", what, strerror(errno));
    exit(2);
}

static struct sockaddr_in loopback(void)
{
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

/* A listener on an ephemeral loopback port; its port goes to *port. */
static int listener(unsigned short *port)
{
    struct sockaddr_in a = loopback();
    socklen_t len = sizeof a;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 2) ||
        getsockname(s, (struct sockaddr *)&a, &len))
        die("listen");
    *port = ntohs(a.sin_port);
    return s;
}

static void nodelay(int s)
{
    int one = 1;
    if (setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one))
        die("TCP_NODELAY");
}

static int dial(unsigned short port)
{
    struct sockaddr_in a = loopback();
    int s = socket(AF_INET, SOCK_STREAM, 0);
    a.sin_port = htons(port);
    if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a))
        die("connect");
    nodelay(s);
    return s;
}

static int take(int l)
{
    int s = accept(l, NULL, NULL);
    if (s < 0)
        die("accept");
    nodelay(s);
    return s;
}

/* Connection models measured. */
enum model { ONE_SOCKET, ONE_WAY, ONE_WAY_DELAYED_ACKS };

/* n exchanges: send 8 bytes on tx, then poll rx until 8 bytes have arrived. */
static void exchange(int tx, int rx, long n, enum model m)
{
    char buf[8] = {0};
    const int off = 0;
    for (long i = 0; i < n; i++) {
        /* The kernel drops delayed ACKs by itself after an idle spell: re-arm. */
        if (m == ONE_WAY_DELAYED_ACKS && i % 64 == 0 &&
            setsockopt(rx, IPPROTO_TCP, TCP_QUICKACK, &off, sizeof off))
            die("TCP_QUICKACK");
        if (send(tx, buf, sizeof buf, 0) != (ssize_t)sizeof buf)
            die("send");
        size_t got = 0;
        while (got < sizeof buf) {
            ssize_t r = recv(rx, buf + got, sizeof buf - got, MSG_DONTWAIT);
            if (r > 0)
                got += (size_t)r;
            else if (r == 0)
                die("peer closed");
            else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                die("recv");
        }
    }
}

static double seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Microseconds per exchange under model m. */
static double measure(enum model m, long iters)
{
    const int one_way = m != ONE_SOCKET;
    const long warmup = iters / 10 + 1;
    unsigned short p1, p2;
    int l1 = listener(&p1), l2 = listener(&p2);
    pid_t child = fork();
    if (child < 0)
        die("fork");
    if (child == 0) {
        int tx = dial(p1);
        int rx = one_way ? dial(p2) : tx;
        exchange(tx, rx, warmup + iters, m);
        _exit(0);
    }
    int rx = take(l1);
    int tx = one_way ? take(l2) : rx;
    exchange(tx, rx, warmup, m);
    double t0 = seconds();
    exchange(tx, rx, iters, m);
    double us = (seconds() - t0) / (double)iters * 1e6;
    int status = 0;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status))
        die("child");
    close(l1);
    close(l2);
    close(rx);
    if (one_way)
        close(tx);
    return us;
}

int main(int argc, char **argv)
{
    long iters = argc > 1 ? atol(argv[1]) : 200000;
    if (iters <= 0) {
        fprintf(stderr, "tcp_exchange: iterations must be > 0, got '%s'\n", argv[1]);
        return 2;
    }
    printf("one bidirectional socket (MPI): %.2f us per exchange\n", measure(ONE_SOCKET, iters));
    printf("two one-way sockets (NCCL net API): %.2f us per exchange\n", measure(ONE_WAY, iters));
    printf("two one-way sockets, delayed ACKs (cclkit-socket): %.2f us per exchange\n",
           measure(ONE_WAY_DELAYED_ACKS, iters));
    return 0;
}
