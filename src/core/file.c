/* What every reader of a file named by the user shares (src/io's checkpoint readers, the
 * layer's tuning files): opening without blocking and refusing anything but a regular file,
 * naming a dangling symlink, and the names of JSON value types for messages. */
#include "core/file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *moe_io_json_kind(const json_t *v)
{
    if (!v)
        return "absent";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

int moe_io_dangling_target(const char *path, char *target, size_t len)
{
    struct stat sb;
    if (len == 0 || lstat(path, &sb) != 0 || !S_ISLNK(sb.st_mode) || stat(path, &sb) == 0 || errno != ENOENT)
        return 0;
    ssize_t n = readlink(path, target, len - 1);
    if (n < 0)
        return 0;
    target[n] = '\0';
    return 1;
}

const char *moe_io_file_kind(unsigned mode)
{
    const mode_t m = (mode_t)mode;
    return S_ISREG(m) ? "a regular file" : S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO"
         : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket"
         : "a special file";
}

moe_status moe_io_open_regular(moe_ctx *ctx, const char *path, int *fd_out, uint64_t *size_out)
{
    *fd_out = -1;
    *size_out = 0;
    /* O_NONBLOCK: opening a FIFO for reading would wait for a writer (forever) */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        char target[PATH_MAX];
        if (e == ENOENT && moe_io_dangling_target(path, target, sizeof target))
            return moe_set_error(ctx, MOE_ENOTFOUND, "%s: is a dangling symlink to '%s', which does not exist", path,
                                 target);
        return moe_set_error(ctx, e == ENOENT ? MOE_ENOTFOUND : MOE_EIO, "%s: cannot open: %s", path, strerror(e));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return moe_set_error(ctx, MOE_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return moe_set_error(ctx, MOE_EIO, "%s: is %s, not a regular file", path, moe_io_file_kind(sb.st_mode));
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        return moe_set_error(ctx, MOE_EIO, "%s: fcntl: %s", path, strerror(e));
    }
    *fd_out = fd;
    *size_out = (uint64_t)sb.st_size;
    return MOE_OK;
}
