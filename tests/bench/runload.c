/* runload: the client side of the bench's concurrency rows, in C as
 * rawexec is for the raw executes it is measured against (a Python client's
 * own CPU, on the same two cores, is taken from the server's, and its own
 * time is in each run's). Makes N runs of CODE in one conversation, or as
 * many as fit in S seconds ("5s"), one after another on one kept-alive
 * HTTP/1.1 connection, and prints each run's milliseconds and its end in
 * seconds of CLOCK_MONOTONIC (as rawexec's STAMPS=1), one per line.
 *
 *   runload PORT KEY CONVERSATION_ID N|Ss [CODE]
 *
 * A run answered otherwise than 200 (or without a Content-Length) is not
 * printed; their count goes to stderr ("runload: N failed runs") and the
 * exit status is 3. The connection is opened again when the server closes
 * it; a server silent for 600 s fails the run. CODE and CONVERSATION_ID go
 * into the JSON as they are: no quote, backslash or control character. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define ANSWER_MAX (1u << 20)

static double
now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int
connect_to(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    struct timeval t = {.tv_sec = 600};

    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) ||
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) ||
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &t, sizeof(t)) ||
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &t, sizeof(t))) {
        close(fd);
        return -1;
    }
    return fd;
}

static int
send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Reads one answer: its status, and whether the server keeps the
 * connection. -1: the connection broke or the answer was not one. */
static int
read_answer(int fd, char *buf, bool *keep)
{
    size_t have = 0, head = 0, body = 0;
    char *end, *cl;

    for (;;) {
        ssize_t r;
        if (!head && (end = memmem(buf, have, "\r\n\r\n", 4))) {
            head = (size_t)(end - buf) + 4;
            buf[head - 1] = '\0';
            cl = strcasestr(buf, "\r\ncontent-length:");
            if (!cl || strncmp(buf, "HTTP/1.1 ", 9))
                return -1;
            body = strtoul(cl + 17, NULL, 10);
            if (body > ANSWER_MAX - head)
                return -1;
            *keep = !strcasestr(buf, "\r\nconnection: close");
        }
        if (head && have >= head + body) {
            long status = strtol(buf + 9, &end, 10);
            return end == buf + 12 && *end == ' ' ? (int)status : -1;
        }
        r = read(fd, buf + have, ANSWER_MAX - have);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        have += (size_t)r;
    }
}

int
main(int argc, char **argv)
{
    static char answer[ANSWER_MAX];
    char req[4096], body[1024];
    double until;
    long count, done = 0;
    char *end;
    int fd = -1, port, n, len, failed = 0;

    if (argc < 5) {
        fprintf(stderr, "usage: runload PORT KEY CONVERSATION_ID N|Ss [CODE]\n");
        return 2;
    }
    errno = 0;
    port = (int)strtol(argv[1], &end, 10);
    if (errno || *end || port < 1 || port > 65535) {
        fprintf(stderr, "runload: a port of 1 to 65535, not %s\n", argv[1]);
        return 2;
    }
    for (int i = 3; i <= 5 && i < argc; i += 2)
        for (const char *c = argv[i]; *c; c++)
            if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20) {
                fprintf(stderr, "runload: no quote, backslash or control character in %s\n",
                        i == 3 ? "CONVERSATION_ID" : "CODE");
                return 2;
            }
    errno = 0;
    count = strtol(argv[4], &end, 10);
    if (*end == 's' || *end == '.') {
        double secs = strtod(argv[4], &end);
        if (errno || strcmp(end, "s") || !(secs > 0)) {
            fprintf(stderr, "runload: seconds as 5s or 2.5s, not %s\n", argv[4]);
            return 2;
        }
        until = now_s() + secs;
    } else if (errno || *end || count < 1) {
        fprintf(stderr, "runload: a count of runs (N) or seconds (Ss), not %s\n", argv[4]);
        return 2;
    } else {
        until = 0;
    }
    n = snprintf(body, sizeof(body), "{\"conversation_id\": \"%s\", \"code\": \"%s\"}", argv[3],
                 argc > 5 ? argv[5] : "x=1");
    if (n < 0 || (size_t)n >= sizeof(body))
        return 2;
    len = snprintf(req, sizeof(req),
                   "POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
                   "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
                   argv[2], n, body);
    if (len < 0 || (size_t)len >= sizeof(req))
        return 2;
    while (until ? now_s() < until : done < count) {
        double t0;
        bool keep = false;
        int status;

        /* (a connection's opening is no run's time: a client holds one) */
        if (fd < 0 && (fd = connect_to(port)) < 0) {
            perror("runload: connect");
            return 1;
        }
        t0 = now_s();
        status = send_all(fd, req, (size_t)len) ? -1 : read_answer(fd, answer, &keep);
        if (status == 200) {
            double t1 = now_s();
            printf("%.3f %.6f\n", (t1 - t0) * 1000, t1);
            done++;
        } else if (++failed > 1000) {
            fprintf(stderr, "runload: %d failed runs\n", failed);
            return 1;
        }
        if (status < 0 || !keep) {
            close(fd);
            fd = -1;
        }
    }
    if (failed)
        fprintf(stderr, "runload: %d failed runs\n", failed);
    return failed ? 3 : 0;
}
