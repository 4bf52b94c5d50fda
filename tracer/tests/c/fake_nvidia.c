/* Stand-in for a CUDA process's traffic with the NVIDIA driver, on plain files that play
 * the device nodes: PREFIX is e.g. /tmp/x/nvidia, so PREFIX"ctl" plays /dev/nvidiactl.
 * Makes exactly these ioctls (each fails with ENOTTY on a regular file; the syscall
 * tracepoints see them all the same) and one mmap, and writes nothing to stdout:
 *   ioctl(ctl, _IOWR('F', 0x2A, 32), {hClient 1, hObject 2, cmd 0x20800102})  RM_CONTROL
 *   ioctl(nvidia0, _IOWR('F', 0x2B, 48), {.., hClass 0xc86f})                RM_ALLOC
 *   ioctl(nvidia-uvm, 0x30000001, buf)                                         UVM_INITIALIZE
 *   ioctl(OTHER, _IOWR('F', 0x2A, 32), ...)        not a device file: must not be reported
 *   mmap(NULL, 8192, PROT_READ, MAP_SHARED, nvidia0, 4096)
 *   close(ctl), then ioctl on the same fd number reopened on OTHER: not reported. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

struct rm_control { uint32_t h_client, h_object, cmd, flags; uint64_t params; uint32_t size, status; };
struct rm_alloc { uint32_t h_root, h_parent, h_new, h_class; uint64_t alloc_params; uint32_t size, status; uint64_t pad[2]; };

static int open_or_die(const char *path)
{
    int fd = open(path, O_RDWR | O_CREAT, 0600);
    if (fd < 0) {
        perror(path);
        exit(2);
    }
    return fd;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s DEVICE_PREFIX OTHER_FILE\n", argv[0]);
        return 2;
    }
    char path[4096];
    snprintf(path, sizeof path, "%sctl", argv[1]);
    int ctl = open_or_die(path);
    snprintf(path, sizeof path, "%s0", argv[1]);
    int gpu = open_or_die(path);
    if (ftruncate(gpu, 16384) != 0)
        return 2;
    snprintf(path, sizeof path, "%s-uvm", argv[1]);
    int uvm = open_or_die(path);
    int other = open_or_die(argv[2]);

    struct rm_control control = { 1, 2, 0x20800102, 0, 0, 0, 0 };
    ioctl(ctl, _IOWR('F', 0x2A, struct rm_control), &control);
    struct rm_alloc alloc = { 1, 2, 3, 0xc86f, 0, 0, 0, { 0, 0 } };
    ioctl(gpu, _IOWR('F', 0x2B, struct rm_alloc), &alloc);
    char buf[64] = { 0 };
    ioctl(uvm, 0x30000001, buf);
    ioctl(other, _IOWR('F', 0x2A, struct rm_control), &control);
    void *map = mmap(NULL, 8192, PROT_READ, MAP_SHARED, gpu, 4096);
    if (map == MAP_FAILED)
        return 3;

    close(ctl);
    int reused = open_or_die(argv[2]);
    ioctl(reused, _IOWR('F', 0x2A, struct rm_control), &control);
    return reused == ctl ? 0 : 4;
}
