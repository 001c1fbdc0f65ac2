/* LD_PRELOAD write shim for fault tests: writes to files whose path contains FAILWRITE_PATH fail with errno
 * FAILWRITE_ERRNO (e.g. 28 ENOSPC, 5 EIO) once FAILWRITE_AFTER bytes have been written to them, as a failing disk
 * would make them; with FAILWRITE_MODE=full, only writes past the furthest byte written so far fail then, as on a
 * full disk (bytes already on disk can still be overwritten; a file extended by ftruncate is a hole, not space). It wraps the libc calls HDF5's own C code makes (open, write, pwrite), which a Python mock
 * cannot reach. Build: cc -shared -fPIC -o failwrite.so failwrite.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_FD 4096
static char watched[MAX_FD];
static long long written = 0;
static long long high[MAX_FD];  /* per fd: the furthest byte written, i.e. space the "disk" has given the file */

static void watch(int fd, const char *path) {
    const char *want = getenv("FAILWRITE_PATH");
    if (fd >= 0 && fd < MAX_FD) {
        watched[fd] = want && *want && path && strstr(path, want) != NULL;
        high[fd] = 0;
    }
}

static int refuse(int fd, size_t n, off_t off) {
    if (fd < 0 || fd >= MAX_FD || !watched[fd]) return 0;
    const char *after = getenv("FAILWRITE_AFTER");
    const char *mode = getenv("FAILWRITE_MODE");
    if (mode && strcmp(mode, "full") == 0 && off >= 0 && off + (long long)n <= high[fd]) {
        written += (long long)n;  /* overwrites bytes already on disk: a full disk allows it */
        return 0;
    }
    if (written + (long long)n > (after ? atoll(after) : 0)) {
        const char *code = getenv("FAILWRITE_ERRNO");
        errno = code ? atoi(code) : ENOSPC;
        return 1;
    }
    written += (long long)n;
    if (off >= 0 && off + (long long)n > high[fd]) high[fd] = off + (long long)n;
    return 0;
}

typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);
typedef ssize_t (*write_fn)(int, const void *, size_t);
typedef ssize_t (*pwrite_fn)(int, const void *, size_t, off_t);
typedef ssize_t (*writev_fn)(int, const struct iovec *, int);
#define REAL(name, type) static type real = NULL; if (!real) real = (type)dlsym(RTLD_NEXT, name)

int open(const char *path, int flags, ...) {
    REAL("open", open_fn);
    va_list ap; va_start(ap, flags); mode_t mode = va_arg(ap, mode_t); va_end(ap);
    int fd = real(path, flags, mode); watch(fd, path); return fd;
}
int open64(const char *path, int flags, ...) {
    REAL("open64", open_fn);
    va_list ap; va_start(ap, flags); mode_t mode = va_arg(ap, mode_t); va_end(ap);
    int fd = real(path, flags, mode); watch(fd, path); return fd;
}
int openat(int dirfd, const char *path, int flags, ...) {
    REAL("openat", openat_fn);
    va_list ap; va_start(ap, flags); mode_t mode = va_arg(ap, mode_t); va_end(ap);
    int fd = real(dirfd, path, flags, mode); watch(fd, path); return fd;
}
ssize_t write(int fd, const void *buf, size_t n) {
    REAL("write", write_fn);
    return refuse(fd, n, lseek(fd, 0, SEEK_CUR)) ? -1 : real(fd, buf, n);
}
ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    REAL("pwrite", pwrite_fn);
    return refuse(fd, n, off) ? -1 : real(fd, buf, n, off);
}
ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) {
    REAL("pwrite64", pwrite_fn);
    return refuse(fd, n, off) ? -1 : real(fd, buf, n, off);
}
ssize_t writev(int fd, const struct iovec *iov, int cnt) {
    REAL("writev", writev_fn);
    size_t n = 0; for (int i = 0; i < cnt; i++) n += iov[i].iov_len;
    return refuse(fd, n, lseek(fd, 0, SEEK_CUR)) ? -1 : real(fd, iov, cnt);
}
