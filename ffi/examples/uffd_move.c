/* Run with LD_PRELOAD=libmemhook.so MEMHOOK_TRACE=1: an unmodified program
 * that moves pages the way a compacting garbage collector does, with
 * userfaultfd's UFFDIO_MOVE (Linux 6.8), which calls nothing on either
 * mapping. Prints the range it moved from ("moved 0x... 0x..."), or
 * "skipped: ..." where this process cannot make a userfaultfd or the
 * kernel has no UFFDIO_MOVE; ffi/tests/examples.rs looks for memhook's
 * VM_UNMAPPED of exactly that range in the trace on stderr. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

/* From linux/userfaultfd.h, so that older headers build it too. */
struct api { uint64_t api, features, ioctls; };
struct range { uint64_t start, len; };
struct reg { struct range range; uint64_t mode, ioctls; };
struct move { uint64_t dst, src, len, mode; int64_t move; };
#define UFFD_USER_MODE_ONLY 1
#define UFFD_FEATURE_MOVE (1ULL << 16)
#define UFFDIO_API_ 0xc018aa3fUL
#define UFFDIO_REGISTER_ 0xc020aa00UL
#define UFFDIO_MOVE_ 0xc028aa05UL

int main(void) {
    long page = sysconf(_SC_PAGESIZE);
    int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
    if (fd < 0) {
        printf("skipped: no userfaultfd here (%s)\n", strerror(errno));
        return 0;
    }
    struct api api = {0xaa, UFFD_FEATURE_MOVE, 0};
    if (ioctl(fd, UFFDIO_API_, &api) != 0 || !(api.features & UFFD_FEATURE_MOVE)) {
        printf("skipped: no UFFDIO_MOVE in this kernel\n");
        return 0;
    }
    /* Sixteen pages: pages 0 to 5 the source, 8 to 13 the destination. */
    char *p = mmap(NULL, 16 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 1;
    memset(p, 0x5a, 6 * page);
    char *dst = p + 8 * page;
    struct reg reg = {{(uint64_t)(uintptr_t)dst, 6 * (uint64_t)page}, 1 /* MISSING */, 0};
    if (ioctl(fd, UFFDIO_REGISTER_, &reg) != 0) return 2;
    /* Three pages from page 1 of the source to page 1 of the destination. */
    struct move mv = {(uint64_t)(uintptr_t)(dst + page), (uint64_t)(uintptr_t)(p + page), 3 * (uint64_t)page, 0, 0};
    if (ioctl(fd, UFFDIO_MOVE_, &mv) != 0 || mv.move != 3 * page) return 3;
    if (dst[page] != 0x5a || p[page] != 0) return 4;
    printf("moved %p 0x%lx\n", (void *)(p + page), 3 * page);
    close(fd);
    return munmap(p, 16 * page) != 0;
}
