/* LD_PRELOAD shim for Shoal training containers: gethostname() and uname() report
 * SHOAL_HOST (the job's name for this host, e.g. "algo-1", from resourceconfig.json) so
 * that mpirun, its daemons, NCCL and the training script agree with the job's host list.
 * SHOAL_HOST is the variable the launcher sets for ranks too; the image points the
 * launcher's SHOAL_GETHOSTNAME_PRELOAD at this library. Without SHOAL_HOST set, both
 * calls behave as usual. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

static const char *job_hostname(void)
{
    const char *name = getenv("SHOAL_HOST");
    return (name != NULL && name[0] != '\0') ? name : NULL;
}

int uname(struct utsname *buf)
{
    /* glibc's uname() is the syscall; call it directly to avoid recursing into ourselves. */
    long rc = syscall(SYS_uname, buf);
    const char *name = job_hostname();
    if (rc == 0 && name != NULL) {
        strncpy(buf->nodename, name, sizeof buf->nodename - 1);
        buf->nodename[sizeof buf->nodename - 1] = '\0';
    }
    return (int)rc;
}

int gethostname(char *out, size_t len)
{
    struct utsname u;
    size_t n;

    if (uname(&u) != 0)
        return -1;
    n = strlen(u.nodename);
    if (n + 1 > len) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(out, u.nodename, n + 1);
    return 0;
}
