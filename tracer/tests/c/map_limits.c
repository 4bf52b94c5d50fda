/* Holds one entry of --kernel's per-thread in-flight maps while another thread needs
 * one, so that with those maps shrunk to 1 entry the second insert must fail, at a known
 * moment and a known number of times. PREFIX plays /dev/nvidia as in fake_nvidia.c;
 * FIFO is a named pipe the caller created. Exactly these system calls matter:
 *
 *  1. open(PREFIX"ctl")                        an NVIDIA fd (a plain file)
 *  2. thread A: open(FIFO, O_RDONLY)           blocks in openat: A's pending open is held
 *     main, while A blocks (seen in /proc/self/task/A/syscall, read with pread on a file
 *     opened before A started):
 *       open("/dev/null")                      no room for its pending open: 1
 *       open(FIFO, O_WRONLY)                   no room: 2; releases A
 *  3. thread B: ioctl(ctl, FIONBIO, page)      the kernel reads the int at `page`, a
 *     page registered with userfaultfd: B blocks inside the ioctl, its entry held
 *     main, once the fault is reported on the userfaultfd:
 *       ioctl(ctl, FIONBIO, &zero)             no room for this ioctl: 1 lost
 *       UFFDIO_ZEROPAGE                        B's ioctl completes: reported
 *
 * Exits 0 when all went as described, 2 on a setup failure (message on stderr). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static const char *g_fifo;
static int g_ctl;
static void *g_page;
static int g_tid_pipe[2];
static int g_go_pipe[2];

static void die(const char *what)
{
    perror(what);
    exit(2);
}

static void *open_fifo(void *arg)
{
    (void)arg;
    pid_t tid = (pid_t)syscall(SYS_gettid);
    char go;
    if (write(g_tid_pipe[1], &tid, sizeof tid) != sizeof tid || read(g_go_pipe[0], &go, 1) != 1)
        die("pipe");
    int fd = open(g_fifo, O_RDONLY);
    if (fd < 0)
        die("open fifo");
    close(fd);
    return NULL;
}

static void *ioctl_on_page(void *arg)
{
    (void)arg;
    /* FIONBIO on a regular file fails or not; only the time it spends inside matters. */
    ioctl(g_ctl, FIONBIO, g_page);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s DEVICE_PREFIX FIFO\n", argv[0]);
        return 2;
    }
    g_fifo = argv[2];
    char path[4096];
    snprintf(path, sizeof path, "%sctl", argv[1]);
    g_ctl = open(path, O_RDWR | O_CREAT, 0600);
    if (g_ctl < 0)
        die(path);

    /* 2: a pending open held by thread A. */
    if (pipe(g_tid_pipe) != 0 || pipe(g_go_pipe) != 0)
        die("pipe");
    pthread_t a;
    if (pthread_create(&a, NULL, open_fifo, NULL) != 0)
        die("pthread_create");
    pid_t tid;
    if (read(g_tid_pipe[0], &tid, sizeof tid) != sizeof tid)
        die("read tid");
    snprintf(path, sizeof path, "/proc/self/task/%d/syscall", tid);
    int syscall_file = open(path, O_RDONLY);
    if (syscall_file < 0)
        die(path);
    if (write(g_go_pipe[1], "g", 1) != 1)
        die("write go");
    char now[64];
    for (;;) {
        ssize_t n = pread(syscall_file, now, sizeof now - 1, 0);
        if (n < 0)
            die("pread syscall");
        now[n] = '\0';
        /* openat is syscall 257 on x86-64; A blocks in it until a writer opens. */
        if (strncmp(now, "257 ", 4) == 0)
            break;
        usleep(1000);
    }
    int null_fd = open("/dev/null", O_RDONLY);
    int writer = open(g_fifo, O_WRONLY);
    if (null_fd < 0 || writer < 0)
        die("open while A waits");
    pthread_join(a, NULL);

    /* 3: an ioctl held by thread B, blocked on a page only userfaultfd can supply. */
    int uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC);
    if (uffd < 0)
        die("userfaultfd");
    struct uffdio_api api = {.api = UFFD_API};
    if (ioctl(uffd, UFFDIO_API, &api) != 0)
        die("UFFDIO_API");
    long page_size = sysconf(_SC_PAGESIZE);
    g_page = mmap(NULL, (size_t)page_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                  -1, 0);
    if (g_page == MAP_FAILED)
        die("mmap");
    struct uffdio_register reg = {
        .range = {.start = (unsigned long)g_page, .len = (unsigned long)page_size},
        .mode = UFFDIO_REGISTER_MODE_MISSING,
    };
    if (ioctl(uffd, UFFDIO_REGISTER, &reg) != 0)
        die("UFFDIO_REGISTER");
    pthread_t b;
    if (pthread_create(&b, NULL, ioctl_on_page, NULL) != 0)
        die("pthread_create");
    struct uffd_msg msg;
    if (read(uffd, &msg, sizeof msg) != sizeof msg || msg.event != UFFD_EVENT_PAGEFAULT)
        die("read fault");
    int zero = 0;
    ioctl(g_ctl, FIONBIO, &zero);
    struct uffdio_zeropage fill = {
        .range = {.start = (unsigned long)g_page, .len = (unsigned long)page_size},
    };
    if (ioctl(uffd, UFFDIO_ZEROPAGE, &fill) != 0)
        die("UFFDIO_ZEROPAGE");
    pthread_join(b, NULL);
    return 0;
}
